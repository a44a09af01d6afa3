"""A fleet behind one DNS name (`dns:///breeze-fleet:PORT`), resolved by gRPC's own resolver: three real workers
listen on 127.0.0.1, .2 and .3 at the same port, and the client runs in a private mount namespace whose
/etc/hosts names the fleet (the machine's own /etc/hosts is untouched).

- The SDK spreads jobs over every address the name resolves to, and nothing else.
- A worker added to the name later gets jobs without restarting the client: the worker's
  --max-connection-age-s makes the client reconnect, and gRPC resolves the name again; a stream longer
  than that age finishes on its connection.
- `breeze-client synth --target dns:///...` takes the same address, and its artifact is fetched from the
  worker it names.

Needs root (unshare -m, mount --bind)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

import pytest
from host_tools import need_tool
from served import ENV, ServedWorker, free_port, start_all

pytestmark = pytest.mark.root

NAME = "breeze-fleet"
CONNECTION_AGE_S = 2.0

# The client side, run inside the namespace: one line in ("JOBS FRAMES"), one JSON line out (each job's worker).
PROBE = """
import json, sys
from breeze_client.channel import ConnectionOptions
from breeze_client.sdk import BreezeClient
# gRPC resolves a name at most every 30 s by default; the test waits 1 s instead
opts = ConnectionOptions(target=sys.argv[1], timeout_s=120,
                         extra_options=(("grpc.dns_min_time_between_resolutions_ms", 1000),))
with BreezeClient(options=opts) as client:
    for line in sys.stdin:
        jobs, frames = map(int, line.split())
        results = [client.synthesize("Hello from the fleet.", max_frames=frames, seed=i) for i in range(jobs)]
        print(json.dumps([[r.job.artifact_endpoint, r.stats.frames, r.artifact is not None] for r in results]),
              flush=True)
"""


def _in_namespace(hosts_file, *argv: str, **kw) -> subprocess.Popen:
    """argv in a private mount namespace where /etc/hosts is `hosts_file`."""
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return subprocess.Popen(["unshare", "-m", "sh", "-c", script, str(hosts_file), *argv], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _ask(probe: subprocess.Popen, jobs: int, frames: int = 2) -> list:
    probe.stdin.write(f"{jobs} {frames}\n")
    probe.stdin.flush()
    line = probe.stdout.readline()
    assert line, f"the probe ended: {probe.stderr.read()[-3000:]}"
    return json.loads(line)


def test_a_dns_name_spreads_jobs_and_finds_workers_added_later(tmp_path):
    need_tool("unshare")  # and root: the module's mark
    port, artifact_port = free_port(), free_port()
    workers = [ServedWorker(tmp_path / f"w{i}", "--max-connection-age-s", str(CONNECTION_AGE_S),
                            "--max-active-streams", "2", host=f"127.0.0.{i + 1}", port=port,
                            artifact_port=artifact_port) for i in range(3)]
    for w in workers:
        w.artifact_dir.mkdir()
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 {NAME}\n127.0.0.2 {NAME}\n")  # the third worker is not in the name yet
    start_all(workers)
    probe = None
    try:
        probe = _in_namespace(hosts, sys.executable, "-c", PROBE, f"dns:///{NAME}:{port}", stdin=subprocess.PIPE)
        first = _ask(probe, 8)
        spread = Counter(endpoint for endpoint, _, _ in first)
        assert set(spread) == {workers[0].artifact_target, workers[1].artifact_target}, spread
        assert min(spread.values()) >= 3, spread  # round robin, after the first health watch reported

        # a stream that outlives the connection age finishes on its own connection
        long_job = _ask(probe, 1, frames=40)[0]
        assert long_job[1] == 40 and long_job[2], long_job

        with hosts.open("a") as f:  # the same file (inode) the namespace has bind-mounted
            f.write(f"127.0.0.3 {NAME}\n")
        t0 = time.monotonic()
        later: Counter = Counter()
        while workers[2].artifact_target not in later:
            assert time.monotonic() - t0 < 60, f"the added worker got no job: {later}"
            later.update(endpoint for endpoint, _, _ in _ask(probe, 3))
        found_s = time.monotonic() - t0
        probe.stdin.close()
        assert probe.wait(30) == 0, probe.stderr.read()[-3000:]

        cli = _in_namespace(hosts, sys.executable, "-m", "breeze_client.cli", "synth", "Said through the CLI.",
                            "--max-frames", "2", "--json", "-", "--target", f"dns:///{NAME}:{port}")
        out, err = cli.communicate(timeout=120)
        assert cli.returncode == 0, err
        artifact = json.loads(out)["artifact"]
        assert artifact["endpoint"] in {w.artifact_target for w in workers}
        fetch = subprocess.run([sys.executable, "-m", "breeze_client.cli", "fetch", artifact["artifact_id"],
                                "-o", str(tmp_path / "cli.wav"), "--json", "-", "--artifact-target",
                                artifact["endpoint"], "--target", workers[0].target],
                               env=ENV, capture_output=True, text=True, timeout=120)
        assert fetch.returncode == 0, fetch.stderr
        assert json.loads(fetch.stdout)["verified"] is True
    finally:
        if probe is not None and probe.poll() is None:
            probe.kill()
            probe.wait(10)
        for w in workers:
            w.stop()
    print(f"\ndns:///{NAME}:{port} -> 2 addresses: jobs per worker {dict(spread)}; a 40-frame stream across "
          f"the {CONNECTION_AGE_S:.0f} s connection age finished; the third address added to the name got jobs "
          f"{found_s:.1f} s later ({dict(later)})")
