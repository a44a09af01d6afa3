"""Fetching by artifact id through a fleet address: three real grpc.aio workers (engine doubles, each with its
own artifact store) on loopback behind `ipv4:A,B,C`. The client is given only the id and the fleet address and
finds the worker that holds each artifact, wherever the call would have landed; an id no worker holds, a
malformed id and a worker that is down are each said plainly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from fake_engine import FakeEngine
from transport_helpers import worker_settings

from breeze_client.aio import AsyncBreezeClient
from breeze_client.errors import InvalidArgument, NotFound
from breeze_client.sdk import BreezeClient
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.transport.server import create_server

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")))


@pytest_asyncio.fixture
async def three(tmp_path):
    """Three workers; each has written one artifact of its own (through its own address)."""
    servers, artifacts = [], []
    for i in range(3):
        settings = worker_settings(tmp_path / f"w{i}")
        store = ArtifactStore(settings.artifacts)
        servers.append(await create_server(settings, FakeEngine(store), store))
    for i, s in enumerate(servers):
        async with AsyncBreezeClient(f"127.0.0.1:{s.synthesis_port}") as client:
            result = await client.synthesize(f"made on worker {i}", seed=i)
        assert result.artifact.endpoint == s.artifact_endpoint
        artifacts.append(result.artifact)
    yield servers, artifacts
    await asyncio.gather(*(s.stop(0) for s in servers))


def _fleet(servers) -> str:
    return "ipv4:" + ",".join(f"127.0.0.1:{s.synthesis_port}" for s in servers)


async def test_each_artifact_is_fetched_by_id_from_the_worker_that_holds_it(three, tmp_path):
    servers, artifacts = three
    fleet = _fleet(servers)

    def by_id() -> list:
        with BreezeClient(fleet, timeout_s=30) as client:
            return [client.fetch(a.artifact_id, tmp_path / f"{a.artifact_id}.wav") for a in artifacts]

    fetched = await asyncio.to_thread(by_id)
    assert [f.endpoint for f in fetched] == [s.artifact_endpoint for s in servers]
    assert all(f.verified and f.size_bytes == a.size_bytes for f, a in zip(fetched, artifacts))
    async with AsyncBreezeClient(fleet, timeout_s=30) as client:
        stats = [await client.stat(a.artifact_id) for a in artifacts]
        assert [s.sha256 for s in stats] == [a.sha256 for a in artifacts]
        again = await client.fetch(artifacts[2].artifact_id)
        assert again.verified and again.endpoint == servers[2].artifact_endpoint

    cli = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "breeze_client.cli", "fetch", artifacts[1].artifact_id, "-o",
                         str(tmp_path / "cli.wav"), "--target", fleet, "--timeout", "30", "--json", "-"],
        capture_output=True, text=True, timeout=120, env=ENV)
    assert cli.returncode == 0, cli.stderr
    report = json.loads(cli.stdout)
    assert report["verified"] and report["endpoint"] == servers[1].artifact_endpoint


async def test_an_id_no_worker_holds_says_who_was_asked(three):
    servers, artifacts = three
    async with AsyncBreezeClient(_fleet(servers), timeout_s=30) as client:
        with pytest.raises(NotFound, match="asked the 3 worker") as info:
            await client.fetch("art-" + "0" * 32)
        assert all(f"127.0.0.1:{s.synthesis_port}" in info.value.message for s in servers)
        with pytest.raises(InvalidArgument, match="malformed"):
            await client.stat("../etc/passwd")


async def test_a_worker_that_is_down_does_not_hide_the_others(three):
    servers, artifacts = three
    await servers[0].stop(0)
    async with AsyncBreezeClient(_fleet(servers), timeout_s=30) as client:
        fetched = await client.fetch(artifacts[2].artifact_id)
        assert fetched.verified and fetched.endpoint == servers[2].artifact_endpoint
        with pytest.raises(NotFound, match="1 could not be asked") as info:  # it may have been on the stopped one
            await client.fetch(artifacts[0].artifact_id)
        assert f"127.0.0.1:{servers[0].synthesis_port}: UNAVAILABLE" in info.value.message


def test_a_fleet_address_resolves_to_its_workers_with_the_names_tls_checks():
    import socket

    from breeze_client import fleet
    from breeze_client.channel import ConnectionOptions

    def resolve(host, port, type):  # what a resolver answers for a headless service of two pods (and a repeat)
        assert (host, port, type) == ("tts.example", 50051, socket.SOCK_STREAM)
        return [(socket.AF_INET, type, 6, "", (ip, port)) for ip in ("10.0.0.1", "10.0.0.2", "10.0.0.1")] + [
            (socket.AF_INET6, type, 6, "", ("fd00::3", port, 0, 0))]

    tls = ConnectionOptions(target="dns:///tts.example:50051", tls=True)
    found = fleet.members(tls, resolve)
    assert [m.address for m in found] == ["10.0.0.1:50051", "10.0.0.2:50051", "[fd00::3]:50051"]
    assert {m.options.tls_server_name for m in found} == {"tts.example"}  # each IP is checked against the name
    assert [m.options.target for m in found] == [m.address for m in found]
    plain = fleet.members(ConnectionOptions(target="dns:///tts.example:50051"), resolve)
    assert {m.options.tls_server_name for m in plain} == {None}
    listed = fleet.members(ConnectionOptions(target="ipv6:[::1]:7,[fd00::2]:8"))
    assert [m.address for m in listed] == ["[::1]:7", "[fd00::2]:8"]
    assert [m.address for m in fleet.members(ConnectionOptions(target="gpu-host:50051"))] == ["gpu-host:50051"]
    assert not fleet.is_fleet("gpu-host:50051") and fleet.is_fleet("ipv4:10.0.0.1:1,10.0.0.2:1")
