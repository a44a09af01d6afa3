"""The SDK's synthesis channel over a fleet address, against real grpc.aio workers (engine doubles, each with its
own artifact store) on loopback: gRPC's round_robin spreads jobs, its client-side health checking keeps a
NOT_SERVING worker out, its retry policy moves a refused-before-JobStarted call to another worker and never
repeats one that streamed audio, and every artifact is fetched from the worker that advertised it.

What is under test is gRPC's own machinery driven by our service config (channel.FLEET_SERVICE_CONFIG); the
control cases show that without the config the same servers behave differently."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import grpc
import pytest
import pytest_asyncio
from fake_engine import FakeEngine
from transport_helpers import worker_settings

from breeze_client.aio import AsyncBreezeClient
from breeze_client.channel import SYNTHESIS_SERVICE
from breeze_client.errors import DeadlineExceeded, Unavailable
from breeze_client.sdk import BreezeClient
from breeze_tts_proto.v1 import synthesis_pb2, synthesis_pb2_grpc
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.engine import types as et
from breeze_worker.errors import Unavailable as WorkerUnavailable
from breeze_worker.transport.server import create_server


class RefusingEngine(FakeEngine):
    """Refuses every job before it starts, as a draining worker does (UNAVAILABLE, nothing written)."""

    def __init__(self, store, **kw) -> None:
        super().__init__(store, **kw)
        self.refused = 0

    async def synthesize(self, request, *, timeout_s=None, received_ns=None):
        self.refused += 1
        raise WorkerUnavailable("shutting down; retry on another worker")
        yield  # an async generator, like the real engine's


class DrainingEngine(FakeEngine):
    """Begins to drain at its first job: reports NOT_SERVING, then refuses the job (UNAVAILABLE)."""

    servers = None

    async def synthesize(self, request, *, timeout_s=None, received_ns=None):
        await self.servers.set_serving(False)
        raise WorkerUnavailable("the worker is shutting down and this request had not started")
        yield  # an async generator, like the real engine's


class DyingEngine(FakeEngine):
    """Starts the job, streams two chunks, then fails UNAVAILABLE (a worker lost mid-stream)."""

    def __init__(self, store, **kw) -> None:
        super().__init__(store, **kw)
        self.calls = 0

    async def synthesize(self, request, *, timeout_s=None, received_ns=None):
        self.calls += 1
        n = 0
        async for event in super().synthesize(request, timeout_s=timeout_s):
            yield event
            n += isinstance(event, et.AudioChunk)
            if n == 2:
                raise WorkerUnavailable("the worker stopped while this job was running")


class Fleet:
    """N workers, each its own servers, engine and artifact store; `target` is one ipv4: fleet address."""

    def __init__(self) -> None:
        self.servers = []
        self.engines = []

    async def add(self, tmp_path, engine_class=FakeEngine, **engine_kw) -> None:
        settings = worker_settings(tmp_path / f"w{len(self.servers)}")
        store = ArtifactStore(settings.artifacts)
        engine = engine_class(store, frame_delay_s=0.005, **engine_kw)
        self.servers.append(await create_server(settings, engine, store))
        self.engines.append(engine)

    @property
    def target(self) -> str:
        return "ipv4:" + ",".join(f"127.0.0.1:{s.synthesis_port}" for s in self.servers)

    def index_of(self, artifact_endpoint: str) -> int:
        return [s.artifact_endpoint for s in self.servers].index(artifact_endpoint)

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop(0) for s in self.servers))


@pytest_asyncio.fixture
async def fleet(tmp_path):
    fleet = Fleet()
    yield fleet
    await fleet.stop()


async def _run_jobs(client: AsyncBreezeClient, n: int) -> list:
    return [await client.synthesize(f"job {i}", max_frames=3, seed=i) for i in range(n)]


async def _wait_until_balanced(client: AsyncBreezeClient, fleet: Fleet, serving: set[int]) -> None:
    """Until a round of jobs goes to exactly the workers in `serving` (every health watch has reported)."""
    deadline = time.monotonic() + 20
    while True:
        window = [await client.synthesize("warm", max_frames=1) for _ in range(2 * len(serving))]
        seen = {fleet.index_of(r.job.artifact_endpoint) for r in window}
        if seen == serving:
            return
        assert time.monotonic() < deadline, f"jobs still go to {seen}, not {serving}"


async def test_round_robin_spreads_jobs_over_every_worker_and_artifacts_come_from_each_jobs_worker(fleet, tmp_path):
    for _ in range(3):
        await fleet.add(tmp_path)
    async with AsyncBreezeClient(fleet.target, timeout_s=30) as client:
        await _wait_until_balanced(client, fleet, {0, 1, 2})
        results = await _run_jobs(client, 9)
        taken = Counter(fleet.index_of(r.job.artifact_endpoint) for r in results)
        print(f"\njobs per worker over {fleet.target}: {dict(sorted(taken.items()))}")
        assert taken == {0: 3, 1: 3, 2: 3}  # round robin: one turn each
        for r in results:
            assert r.artifact.endpoint == r.job.artifact_endpoint  # the job's own worker holds its artifact
            fetched = await client.fetch(r.artifact)
            assert fetched.verified and fetched.endpoint == r.artifact.endpoint
            assert fetched.data[44:] == r.audio
            # the other workers do not have it: fetching anywhere else would fail
            other = fleet.servers[(fleet.index_of(r.artifact.endpoint) + 1) % 3].artifact_endpoint
            with pytest.raises(Exception, match="NOT_FOUND|not found|no artifact"):
                await client.fetch(r.artifact.artifact_id, endpoint=other, max_resumes=0)


async def test_a_not_serving_worker_gets_no_jobs_through_grpc_health_checking(fleet, tmp_path):
    for _ in range(3):
        await fleet.add(tmp_path)
    await fleet.servers[1].set_serving(False)  # its engine would still accept: only health keeps jobs away
    async with AsyncBreezeClient(fleet.target, timeout_s=30) as client:
        await _wait_until_balanced(client, fleet, {0, 2})
        taken = Counter(fleet.index_of(r.job.artifact_endpoint) for r in await _run_jobs(client, 12))
        assert taken[1] == 0 and taken[0] == taken[2] == 6, taken

        # the watch follows changes both ways: 1 back, 0 out
        await fleet.servers[1].set_serving(True)
        await fleet.servers[0].set_serving(False)
        await _wait_until_balanced(client, fleet, {1, 2})
        later = Counter(fleet.index_of(r.job.artifact_endpoint) for r in await _run_jobs(client, 12))
        assert later[0] == 0 and later[1] == later[2] == 6, later
        print(f"\nworker 1 NOT_SERVING: {dict(taken)}; then worker 0 NOT_SERVING: {dict(later)}")

    # control: the same round robin without healthCheckConfig sends worker 0 its share although it is NOT_SERVING
    config = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
    async with grpc.aio.insecure_channel(fleet.target, options=[("grpc.service_config", config)]) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        ends = Counter()
        for _ in range(12):
            async for msg in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text="x", max_frames=1), timeout=30):
                if msg.HasField("started"):
                    ends[fleet.index_of(msg.started.artifact_endpoint)] += 1
        assert ends[0] > 0, ends


async def test_a_call_refused_before_job_started_fails_over_to_another_worker(fleet, tmp_path):
    await fleet.add(tmp_path)
    await fleet.add(tmp_path, RefusingEngine)  # SERVING, yet refusing: the moment a worker begins to drain
    await fleet.add(tmp_path)
    async with AsyncBreezeClient(fleet.target, timeout_s=30) as client:
        await _wait_until_balanced(client, fleet, {0, 2})
        # a clone request above gRPC's default 256 KiB retry buffer fails over too
        big = dict(reference_audio=b"\0" * (600 * 1024), reference_text="words")
        results = [await client.synthesize(f"job {i}", max_frames=2, **(big if i % 2 else {})) for i in range(10)]
    assert all(r.artifact is not None for r in results)
    taken = Counter(fleet.index_of(r.job.artifact_endpoint) for r in results)
    refused = fleet.engines[1].refused
    print(f"\n10 jobs: per worker {dict(taken)}; the refusing worker turned away {refused} attempts")
    assert taken[1] == 0 and taken[0] + taken[2] == 10
    assert refused >= 3  # round robin kept offering it jobs; each refusal moved on to another worker


async def test_a_failure_after_audio_is_reported_and_never_retried(fleet, tmp_path):
    await fleet.add(tmp_path, DyingEngine)
    await fleet.add(tmp_path, DyingEngine)
    async with AsyncBreezeClient(fleet.target, timeout_s=30) as client:
        stream = await client.stream("cut off mid-stream", max_frames=20)
        chunks = 0
        with pytest.raises(Unavailable, match="stopped while this job was running"):
            async for _ in stream:
                chunks += 1
        assert chunks == 2 and stream.job is not None
    assert sum(e.calls for e in fleet.engines) == 1  # one attempt: the audio was never restarted elsewhere


async def test_failover_stays_within_the_deadline_when_every_worker_refuses(fleet, tmp_path):
    for _ in range(2):
        await fleet.add(tmp_path, RefusingEngine)
    async with AsyncBreezeClient(fleet.target, timeout_s=30) as client:
        t0 = time.monotonic()
        with pytest.raises(Unavailable, match="retry on another worker"):
            await client.synthesize("nobody takes it", max_frames=2)
        elapsed = time.monotonic() - t0
        attempts = sum(e.refused for e in fleet.engines)
        assert 2 <= attempts <= 5  # gRPC's ceiling on attempts, spread over both workers
        assert all(e.refused >= 1 for e in fleet.engines)
        t0 = time.monotonic()
        with pytest.raises((DeadlineExceeded, Unavailable)):
            await client.synthesize("a short deadline", max_frames=2, timeout_s=0.3)
        assert time.monotonic() - t0 < 2.0  # the retries never outlive the call's deadline
    print(f"\nevery worker refusing: UNAVAILABLE after {attempts} attempts in {elapsed:.2f} s")


async def test_the_sync_client_ends_a_refused_call_when_no_worker_is_left(fleet, tmp_path):
    # the last worker starts draining under a job: gRPC's retry finds no healthy worker and the call must end
    # at once (grpcio's default synchronous stream reader left it hanging past its deadline)
    await fleet.add(tmp_path, DrainingEngine)
    fleet.engines[0].servers = fleet.servers[0]

    outcome: dict = {}

    def synthesize() -> None:
        with BreezeClient(fleet.target, timeout_s=20) as client:
            t0 = time.monotonic()
            try:
                client.synthesize("the last worker drains", max_frames=2)
            except Unavailable as exc:
                outcome["error"] = exc
            outcome["elapsed"] = time.monotonic() - t0

    caller = threading.Thread(target=synthesize, daemon=True)  # a hung call must not hold the test's loop
    caller.start()
    deadline = time.monotonic() + 30
    while caller.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert "elapsed" in outcome, "the call did not end, not even at its 20 s deadline"
    assert outcome["elapsed"] < 10 and "reports NOT_SERVING" in outcome["error"].message, outcome


def test_the_fleet_health_check_watches_the_service_the_worker_reports():
    # the worker flips exactly this name (with "") to NOT_SERVING while it warms up and when it drains
    from breeze_worker.transport.server import SYNTHESIS_SERVICE as WORKER_SERVICE

    assert SYNTHESIS_SERVICE == WORKER_SERVICE
