"""Three real workers (`breeze-worker serve` processes, tiny default model, CPU) behind one fleet address
(`ipv4:127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2`), driven by the SDK, with the faults sent from outside:

1. jobs spread over all three (the client's attribution checked against each worker's own /metrics);
2. worker 1 gets SIGTERM while a job streams on it: it takes no new job, its running job finishes, and every
   artifact it made is fetched from it after its synthesis port closed, during its artifact grace;
3. worker 2 gets kill -9 while one job streams on it and more wait in its queue: the waiting ones fail over
   to worker 0 and finish there, the streaming one reports UNAVAILABLE after its audio (never restarted).

Every artifact reported is fetched from the address its job's worker advertised, and its SHA-256 is checked
(by the SDK against the worker's value, and here against the file in that worker's own artifact directory).
The figures are printed (`pytest -s`)."""

from __future__ import annotations

import hashlib
import signal
import socket
import time
from collections import Counter

from served import ServedWorker, start_all
from streams import StreamInThread

from breeze_client.sdk import BreezeClient

LONG = dict(max_frames=60, temperature=0.0)  # long enough to still be streaming when the fault comes
SHORT = dict(max_frames=4)
WORKER_ARGS = ("--max-active-streams", "1", "--max-queue", "8", "--grace-s", "90", "--artifact-grace-s", "60")


def _wait(predicate, timeout_s: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True


def _jobs_total(worker: ServedWorker) -> int:
    return int(sum(v for k, v in worker.metrics().items() if k.startswith("breeze_jobs_total{")))


def _one_long_job_on_each(client: BreezeClient, books, busy: tuple[ServedWorker, ...]) -> list[StreamInThread]:
    """A long job streaming on each of `busy`, sent through the fleet address. round_robin's picker starts at a
    random index whenever a subchannel changes state (the drained worker's reconnect attempts do), so two
    consecutive picks can land on the same worker: such an extra waits in that worker's queue (one stream slot
    each) and is cancelled, and the next one is sent."""
    started: list[StreamInThread] = []
    for attempt in range(12):
        s = StreamInThread(client, "A long job on each live worker.", seed=30 + attempt, **LONG)
        deadline = time.monotonic() + 60
        while s.job is None:
            queued_on = [w for w in busy if w.metrics()["breeze_queued_requests"] >= 1]
            if queued_on:  # it waits behind a long job already running there
                s.stream.cancel()
                s.finish()
                held = queued_on[0]
                _wait(lambda w=held: w.metrics()["breeze_queued_requests"] == 0, 30, "the extra to leave")
                print(f"\nlong job {attempt} queued behind a running one; cancelled")
                break
            assert s.is_alive() and time.monotonic() < deadline, f"a long job did not start: {s.error}"
            time.sleep(0.02)
        else:
            s.wait_for(2)
            started.append(s)
            if {books.index(x.job.artifact_endpoint) for x in started} == {books.index(w.artifact_target)
                                                                          for w in busy}:
                return started
    raise AssertionError(f"no long job on each of the live workers after 12 tries: {len(started)} started")


class Books:
    """What the test saw: each finished job's worker, and each artifact fetched and checked."""

    def __init__(self, workers: list[ServedWorker]) -> None:
        self.workers = workers
        self.fetched = 0
        self.fetched_bytes = 0

    def index(self, artifact_endpoint: str) -> int:
        return [w.artifact_target for w in self.workers].index(artifact_endpoint)

    def check_artifact(self, client: BreezeClient, result, audio: bytes | None = None) -> None:
        """Fetch from the advertised address; the bytes match the worker's SHA-256, its file, and the audio."""
        a = result.artifact
        assert a is not None, result.artifact_unavailable
        assert a.endpoint == result.job.artifact_endpoint  # JobStarted named the worker that holds it
        fetched = client.fetch(a, None, max_resumes=0)
        assert fetched.verified and fetched.endpoint == a.endpoint
        on_disk = self.workers[self.index(a.endpoint)].artifact_dir / f"{a.artifact_id}.wav"
        assert hashlib.sha256(on_disk.read_bytes()).hexdigest() == a.sha256 == hashlib.sha256(fetched.data).hexdigest()
        assert fetched.data[44:] == (audio if audio is not None else result.audio)
        self.fetched += 1
        self.fetched_bytes += len(fetched.data)


def test_three_workers_spread_drain_and_crash_without_losing_an_artifact(tmp_path):
    workers = [ServedWorker(tmp_path / f"w{i}", *WORKER_ARGS) for i in range(3)]
    for w in workers:
        w.artifact_dir.mkdir()
    fleet = "ipv4:" + ",".join(w.target for w in workers)
    books = Books(workers)
    t_start = time.monotonic()
    start_all(workers)
    started_s = time.monotonic() - t_start
    w0, w1, w2 = workers
    try:
        with BreezeClient(fleet, timeout_s=180) as client:
            # ---- 1. spread: every worker takes jobs ----
            warm = []
            while len({books.index(r.job.artifact_endpoint) for r in warm}) < 3:  # every health watch reported
                assert len(warm) < 30, "not all three workers took a job"
                warm.append(client.synthesize("Warm up.", max_frames=1))
            spread = [client.synthesize(f"Job number {i}.", seed=i, **SHORT) for i in range(6)]
            taken = Counter(books.index(r.job.artifact_endpoint) for r in warm + spread)
            assert Counter(books.index(r.job.artifact_endpoint) for r in spread) == {0: 2, 1: 2, 2: 2}
            for i, w in enumerate(workers):  # the workers' own counters agree with the client's attribution
                assert _jobs_total(w) == taken[i]
            held_by_w1 = [r for r in warm + spread if books.index(r.artifact.endpoint) == 1]
            for r in warm + spread:
                if r not in held_by_w1:
                    books.check_artifact(client, r)

            # ---- 2. drain worker 1 while a job streams on it ----
            tries = [StreamInThread(client, "A longer job while a worker drains.", seed=10 + i, **LONG)
                     for i in range(3)]  # one per worker; keep worker 1's, hang up the others
            for s in tries:
                s.wait_for(1)
            running = next(s for s in tries if books.index(s.job.artifact_endpoint) == 1)
            for s in tries:
                if s is not running:
                    s.stream.cancel()
                    s.finish()
            running.wait_for(2)
            w1_jobs_before = _jobs_total(w1)
            w1.signal(signal.SIGTERM)
            with BreezeClient(w1.target, timeout_s=10) as direct:
                _wait(lambda: direct.health() == "NOT_SERVING", 30, "worker 1 to report NOT_SERVING")
            during_drain = [client.synthesize(f"Sent while worker 1 drains, {i}.", seed=20 + i, **SHORT)
                            for i in range(4)]
            drained_to = Counter(books.index(r.job.artifact_endpoint) for r in during_drain)
            assert drained_to[1] == 0 and drained_to[0] + drained_to[2] == 4, drained_to
            for r in during_drain:
                books.check_artifact(client, r)
            running.finish()
            assert running.error is None and running.result.stats.frames == LONG["max_frames"]
            # its synthesis port closes once its job ended; the artifact port serves on through the grace
            _wait(lambda: _refuses_connections(w1.port), 60, "worker 1's synthesis port to close")
            assert w1.proc.poll() is None
            for r in held_by_w1:
                books.check_artifact(client, r)
            books.check_artifact(client, running.result, bytes(running.audio))
            drained_fetches = len(held_by_w1) + 1
            assert _jobs_total(w1) == w1_jobs_before + 1  # only the job that was running when the signal came
            w1.signal(signal.SIGTERM)  # a second signal ends the artifact grace
            assert w1.wait(60) == 0

            # ---- 3. kill -9 worker 2 while one job streams on it and more wait in its queue ----
            long_jobs = _one_long_job_on_each(client, books, (w0, w2))
            w0_jobs_before = _jobs_total(w0)  # after any extra that queued on a busy worker was cancelled
            assert {books.index(s.job.artifact_endpoint) for s in long_jobs} == {0, 2}
            short_jobs: list[StreamInThread] = []
            while len(short_jobs) < 12 and w2.metrics()["breeze_queued_requests"] < 2:  # round robin: every other
                short_jobs.append(StreamInThread(client, f"Queued behind the long job, {len(short_jobs)}.",
                                                 seed=40 + len(short_jobs), **SHORT))
                time.sleep(0.3)
            _wait(lambda: w2.metrics()["breeze_queued_requests"] >= 2, 10, "two jobs queued on worker 2")
            queued_on_w2 = int(w2.metrics()["breeze_queued_requests"])
            assert all(s.job is None for s in short_jobs)  # none has started: all wait behind the long jobs
            w2.kill9()
            t_kill = time.monotonic()
            for s in long_jobs + short_jobs:
                s.finish()
            streaming_on_w2 = next(s for s in long_jobs if books.index(s.job.artifact_endpoint) == 2)
            survivor = next(s for s in long_jobs if s is not streaming_on_w2)
            assert streaming_on_w2.error is not None and streaming_on_w2.error.code == "UNAVAILABLE"
            assert streaming_on_w2.chunks >= 2 and streaming_on_w2.result is None  # reported, not restarted
            assert survivor.error is None
            books.check_artifact(client, survivor.result, bytes(survivor.audio))
            for s in short_jobs:  # those queued on worker 2 failed over; all ran on worker 0
                assert s.error is None, s.error
                assert books.index(s.result.job.artifact_endpoint) == 0
                books.check_artifact(client, s.result, bytes(s.audio))
            failover_s = time.monotonic() - t_kill
            # worker 0 ran its long job and every short one, the failed-over included, and nothing else: the
            # job that streamed on worker 2 was not started again there
            assert _jobs_total(w0) == w0_jobs_before + 1 + len(short_jobs)
    finally:
        for w in workers:
            w.stop()
    print(f"\nfleet of 3 started in {started_s:.1f} s; jobs per worker before the faults {dict(sorted(taken.items()))}"
          f"\ndrain: {len(during_drain)} jobs sent while worker 1 drained went to {dict(sorted(drained_to.items()))}; "
          f"{drained_fetches} of its artifacts fetched during its artifact grace"
          f"\nkill -9: {queued_on_w2} job(s) queued on worker 2 failed over, {len(short_jobs)} short jobs all "
          f"finished on worker 0 ({failover_s:.1f} s after the kill); its streaming job reported "
          f"{streaming_on_w2.error.code} after {streaming_on_w2.chunks} chunks"
          f"\nartifacts fetched from their own workers and SHA-256-checked: {books.fetched} "
          f"({books.fetched_bytes} bytes); total {time.monotonic() - t_start:.1f} s")

