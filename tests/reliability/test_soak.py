"""Soak with faults, bounded for CI (well under a minute on 2 cores, the tiny default model): mixed plain / CFG /
clone jobs with random cancels against a real worker process on a small tmpfs, a disk that fills mid-write (from
outside the worker), one kill -9 while jobs write and a fetch is mid-stream, a restart on the same address and
directory. At the end every artifact the worker reported is fetched and checked against its SHA-256 and the audio
its job streamed; no cancelled or killed job's artifact id ever appears; the figures are printed (lost must be
0)."""

from __future__ import annotations

import hashlib
import io
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
import soundfile as sf
from disk import fill, small_tmpfs
from served import ServedWorker
from streams import StreamInThread

from breeze_client.errors import BreezeClientError, NotFound
from breeze_client.sdk import BreezeClient
from breeze_tts_proto.v1 import artifacts_pb2, artifacts_pb2_grpc

pytestmark = pytest.mark.root
MIB = 1024 * 1024
KINDS = ("plain", "cfg", "clone")


def _reference(seed: int) -> bytes:
    t = np.arange(36000) / 24000
    voice = 0.3 * np.sin(2 * np.pi * (150 + 20 * seed) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    sf.write(buf, voice.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


REFERENCES = [_reference(i) for i in range(2)]


@dataclass
class Job:
    index: int
    kind: str
    encoding: str
    cancel_after: int | None  # chunks, or None: read to the end
    artifact_id: str = ""  # from the start message
    outcome: str = ""  # artifact | unavailable | cancelled | error:CODE
    audio: bytes = b""
    sha256: str = ""
    size_bytes: int = 0
    unavailable: str = ""


class Ledger:
    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.faults: list[str] = []
        self.lock = threading.Lock()

    def new_job(self, rng: random.Random) -> Job:
        with self.lock:
            job = Job(len(self.jobs), rng.choice(KINDS), rng.choice(("s16le", "s16le", "f32le")),
                      rng.randint(1, 3) if rng.random() < 0.25 else None)
            self.jobs.append(job)
            return job

    @property
    def reported(self) -> list[Job]:
        return [j for j in self.jobs if j.outcome == "artifact"]


def _options(job: Job, rng: random.Random) -> dict:
    options = dict(max_frames=rng.randint(4, 24), seed=job.index, encoding=job.encoding)
    if job.kind == "cfg":
        options.update(instruction="Speak softly.", cfg_scale=1.5)
    elif job.kind == "clone":
        options.update(reference_audio=REFERENCES[job.index % 2], reference_text="The words of the reference.")
    return options


def _run_job(client: BreezeClient, ledger: Ledger, rng: random.Random, long: bool = False) -> Job:
    job = ledger.new_job(rng)
    options = _options(job, rng)
    if long:
        options.update(max_frames=400, temperature=0.0)
        job.cancel_after = None
    stream = client.stream(f"Soak job {job.index}, {job.kind}.", **options)
    audio, chunks = bytearray(), 0
    try:
        for chunk in stream:
            job.artifact_id = stream.job.artifact_id
            audio += chunk.pcm
            chunks += 1
            if job.cancel_after is not None and chunks >= job.cancel_after:
                stream.cancel()
                job.outcome = "cancelled"
                return job
        result = stream.result
    except BreezeClientError as exc:
        job.outcome = f"error:{exc.code}"
        return job
    job.audio = bytes(audio)
    assert len(job.audio) == result.stats.frames * 1920 * (2 if job.encoding == "s16le" else 4)
    if result.artifact is None:
        job.outcome, job.unavailable = "unavailable", result.artifact_unavailable
    else:
        job.outcome, job.sha256, job.size_bytes = "artifact", result.artifact.sha256, result.artifact.size_bytes
        job.artifact_id = result.artifact.artifact_id
    return job


def _phase(client: BreezeClient, ledger: Ledger, rng: random.Random, jobs: int, fetch_every: int = 3) -> None:
    """`jobs` mixed jobs, 3 at a time; every few finished ones fetched at once, as a client would."""
    seeds = [rng.random() for _ in range(jobs)]
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda s: _run_job(client, ledger, random.Random(s)), seeds))
    for job in done[::fetch_every]:
        if job.outcome == "artifact":
            _check_fetch(client, job)


def _check_fetch(client: BreezeClient, job: Job, **fetch_options) -> int:
    """Fetch a reported artifact; it must be whole (sha256, size) and hold exactly the streamed audio."""
    fetched = client.fetch(job.artifact_id, None, **fetch_options)
    assert fetched.verified and fetched.sha256 == job.sha256 and fetched.size_bytes == job.size_bytes
    data = fetched.data
    assert hashlib.sha256(data).hexdigest() == job.sha256
    assert data.endswith(job.audio) and len(data) - len(job.audio) in (44, 58)  # the WAV header, then the audio
    return fetched.resumes


def _fill_mid_write(disk, worker: ServedWorker, client: BreezeClient, ledger: Ledger) -> None:
    runs = [StreamInThread(client, f"Writing when the disk fills {i}.", max_frames=30, seed=950 + i,
                           temperature=0.0) for i in range(3)]
    for run in runs:
        run.wait_for(2)
    hog = fill(disk)
    for run in runs:
        result = run.finish()
        assert run.error is None and len(run.audio) == result.stats.frames * 1920 * 2  # the audio is whole
        job = Job(len(ledger.jobs), "plain", "s16le", None, run.job.artifact_id)
        if result.artifact is None:
            job.outcome, job.unavailable = "unavailable", result.artifact_unavailable
        else:  # its last bytes and the commit found room after all (nothing is assumed)
            job.outcome, job.sha256, job.size_bytes = "artifact", result.artifact.sha256, result.artifact.size_bytes
            job.audio = bytes(run.audio)
        ledger.jobs.append(job)
    assert client.worker_info(refresh=True).artifact_store_degraded
    hog.unlink()
    ledger.faults.append("disk full mid-write")


class _PausedSink(io.BytesIO):
    """A download destination whose first write waits for `go`: the fetch is mid-stream until then."""

    def __init__(self) -> None:
        super().__init__()
        self.first = threading.Event()
        self.go = threading.Event()

    def write(self, data) -> int:
        if not self.first.is_set():
            self.first.set()
            assert self.go.wait(120)
        return super().write(data)


def _kill_mid_write_and_fetch(worker: ServedWorker, client: BreezeClient, ledger: Ledger) -> tuple[list[str], int]:
    """One kill -9 while two jobs write their artifacts and a fetch is mid-stream; then a restart on the same ports
    and directory. The jobs end with UNAVAILABLE and their artifacts never appear; the restart sweeps their temp
    files; the fetch (16 KiB chunks over a channel whose window stays at 64 KiB, its destination holding its first
    write until the kill, so the worker is surely still sending) resumes and verifies the whole file."""
    big = StreamInThread(client, "An artifact to fetch across a crash.", max_frames=60, seed=990, temperature=0.0,
                         encoding="f32le")
    result = big.finish()
    assert result.artifact is not None, result.artifact_unavailable
    job = Job(len(ledger.jobs), "plain", "f32le", None, result.artifact.artifact_id, "artifact", bytes(big.audio),
              result.artifact.sha256, result.artifact.size_bytes)
    ledger.jobs.append(job)
    slow = BreezeClient(worker.target, timeout_s=300, extra_options=(("grpc.http2.bdp_probe", 0),))
    sink, outcome = _PausedSink(), {}

    def fetch() -> None:
        try:
            outcome["result"] = slow.fetch(job.artifact_id, sink, chunk_size=16 * 1024, resume_timeout_s=120,
                                           endpoint=worker.artifact_target)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    fetching = threading.Thread(target=fetch, daemon=True)
    fetching.start()
    runs = [StreamInThread(client, f"Killed mid-write {i}.", max_frames=400, seed=900 + i, temperature=0.0)
            for i in range(2)]
    for run in runs:
        run.wait_for(3)
    assert sink.first.wait(60)
    killed = [run.job.artifact_id for run in runs]
    worker.kill9()
    sink.go.set()
    for run in runs:
        run.finish()
        assert run.error is not None and run.error.code == "UNAVAILABLE"
        ledger.jobs.append(Job(len(ledger.jobs), "plain", "s16le", None, run.job.artifact_id, "error:UNAVAILABLE"))
    worker.start()  # the same ports and directory
    assert worker.wait_logged("removed 2 unfinished artifact file(s)")
    fetching.join(180)
    slow.close()
    assert "error" not in outcome, outcome.get("error")
    fetched = outcome["result"]
    data = sink.getvalue()
    assert fetched.verified and hashlib.sha256(data).hexdigest() == job.sha256 and data.endswith(job.audio)
    ledger.faults += ["kill -9 mid-write and mid-fetch", "restart"]
    return killed, fetched.resumes


def test_soak_with_crashes_a_full_disk_and_cancels(tmp_path, capsys):
    t0 = time.monotonic()
    rng = random.Random(26)
    ledger = Ledger()
    with small_tmpfs(tmp_path / "disk", 16 * MIB) as disk:
        worker = ServedWorker(disk, "--max-active-streams", "3", "--max-queue", "16", "--artifact-min-free-bytes",
                              str(MIB), "--artifact-min-keep-s", "3600", "--grace-s", "5", "--artifact-grace-s",
                              "0").start()
        try:
            client = BreezeClient(worker.target, timeout_s=300, artifact_target=worker.artifact_target)
            _phase(client, ledger, rng, 9)
            _fill_mid_write(disk, worker, client, ledger)
            _phase(client, ledger, rng, 6)
            killed, resumes = _kill_mid_write_and_fetch(worker, client, ledger)
            _phase(client, ledger, rng, 6)

            verified = 0
            for job in ledger.reported:  # every artifact reported available, after every fault
                _check_fetch(client, job)
                verified += 1
            never = killed + [j.artifact_id for j in ledger.jobs if j.outcome != "artifact" and j.artifact_id]
            stub = artifacts_pb2_grpc.ArtifactsStub(grpc.insecure_channel(worker.artifact_target))
            for artifact_id in never:  # a cancelled, failed or killed job's artifact never appears
                with pytest.raises(grpc.RpcError) as missing:
                    stub.Stat(artifacts_pb2.StatArtifactRequest(artifact_id=artifact_id), timeout=10)
                assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            assert not list(disk.glob(".art-*"))
            with pytest.raises(NotFound):
                client.stat("art-" + "0" * 32)
            metrics = worker.metrics()
            client.close()
        finally:
            worker.stop()

    outcomes = Counter(j.outcome for j in ledger.jobs)
    kinds = Counter(j.kind for j in ledger.jobs)
    causes = Counter(j.unavailable.split(" (")[0] for j in ledger.jobs if j.outcome == "unavailable")
    lost = len(ledger.reported) - verified
    with capsys.disabled():
        print(f"\nsoak: {len(ledger.jobs)} jobs ({', '.join(f'{k} {kinds[k]}' for k in KINDS)}; "
              f"{outcomes['artifact']} with an artifact, {outcomes['unavailable']} streamed without one, "
              f"{outcomes['cancelled']} cancelled, {sum(v for k, v in outcomes.items() if k.startswith('error'))} "
              f"ended by a crash); faults {len(ledger.faults)}: {', '.join(ledger.faults)} (the fetch resumed "
              f"{resumes}x); artifacts reported {len(ledger.reported)}, verified {verified}, lost {lost}; "
              f"never served half-written: {len(never)} ids of unfinished jobs checked absent; unavailable causes: "
              f"{dict(causes)}; active streams at the end {metrics['breeze_active_streams']:g}; "
              f"{time.monotonic() - t0:.0f} s")
    assert lost == 0 and verified == len(ledger.reported) > 0
    assert outcomes["cancelled"] > 0 and outcomes["unavailable"] > 0 and set(kinds) == set(KINDS)
    assert metrics["breeze_active_streams"] == 0
