"""Either end of a stream going away, against real processes: a client killed with kill -9 mid-stream is a cancel
(the worker logs it at INFO, never an ERROR or a traceback, and keeps serving); a worker killed with kill -9
while `breeze-client synth --stream` reads leaves the command saying that the job and its artifact are gone and
what to do."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from served import ENV, ServedWorker

from breeze_client.sdk import BreezeClient

CLIENT = Path(__file__).with_name("stalled_client.py")


def test_clients_that_vanish_mid_stream_are_cancels_logged_without_a_traceback(tmp_path):
    worker = ServedWorker(tmp_path / "artifacts").start()
    try:
        for n in range(5):
            client = subprocess.Popen([sys.executable, str(CLIENT), worker.target, "300"], stdout=subprocess.PIPE,
                                      text=True, env=ENV)
            assert client.stdout.readline().startswith("art-")  # streaming
            time.sleep(0.2 * n)  # later and later into the stream (any moment will do)
            client.kill()
            client.wait(30)
            deadline = time.monotonic() + 120
            while sum("cancelled by the caller" in line for line in worker.log) < n + 1:
                assert time.monotonic() < deadline, "the vanished client's job was not cancelled"
                time.sleep(0.1)
        with BreezeClient(worker.target, timeout_s=120) as sdk:  # the worker keeps serving
            assert sdk.synthesize("Still here.", max_frames=4, seed=1).artifact is not None
        assert not [line for line in worker.log if " ERROR " in line or "Traceback" in line]
    finally:
        worker.stop()


def test_a_worker_killed_mid_stream_leaves_the_client_saying_the_job_and_artifact_are_gone(tmp_path):
    worker = ServedWorker(tmp_path / "artifacts").start()
    out = tmp_path / "partial.wav"
    try:
        synth = subprocess.Popen([sys.executable, "-m", "breeze_client.cli", "synth", "A job its worker will not end.",
                                  "--stream", "-o", str(out), "--max-frames", "300", "--seed", "3", "--temperature",
                                  "0", "--target", worker.target, "--timeout", "300"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.monotonic() + 300
        while not (out.exists() and out.stat().st_size > 44):  # audio is arriving
            assert synth.poll() is None and time.monotonic() < deadline, synth.communicate()
            time.sleep(0.05)
        worker.kill9()
        _, stderr = synth.communicate(timeout=120)
        assert synth.returncode == 1
        assert re.search(r"UNAVAILABLE: the worker was lost while job job-[0-9a-f]+ streamed \(.+\): the job and its "
                         r"artifact art-[0-9a-f]{32} are gone \(no artifact will be committed\), and the [0-9.]+ s of "
                         r"audio received are only its start\. Synthesize again", stderr), stderr
    finally:
        worker.stop()
