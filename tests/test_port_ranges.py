"""Ports outside 1-65535 are refused by both command lines, before anything is dialled or bound (gRPC would
otherwise dial 66051 as 515, and a worker would advertise an address no client can reach). The listening
ports of `breeze-worker serve` take 0 as "any free port"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from breeze_client.channel import ConnectionOptions

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")))


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], env=ENV, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flag,value", [
    ("--target", "127.0.0.1:66051"), ("--target", "localhost:0"), ("--target", "dns:///breeze.tts.svc:70000"),
    ("--target", "ipv4:10.0.0.1:50051,10.0.0.2:65536"), ("--target", "[::1]:-1"),
    ("--artifact-target", "127.0.0.1:99999")])
def test_the_client_refuses_a_port_outside_the_range(flag, value):
    done = _run("breeze_client.cli", "health", flag, value, "--timeout", "5")
    assert done.returncode == 1, done.stderr  # the client's every failure: `error: CODE: message`, exit 1
    port = value.rpartition(":")[2]
    assert (f"error: INVALID_ARGUMENT: {flag} {value}: '{port}' is not a port; a port is a number from 1 to 65535"
            in done.stderr)


@pytest.mark.parametrize("target", ["127.0.0.1:1", "[::1]:65535", "dns:///breeze.tts.svc:50051",
                                    "ipv4:10.0.0.1:50051,10.0.0.2:50052", "unix:/run/breeze.sock", "localhost"])
def test_the_client_takes_every_port_in_the_range_and_targets_without_one(target):
    assert ConnectionOptions(target=target).target == target


@pytest.mark.parametrize("args,message", [
    (("--port", "66051"), "--port (BREEZE_SERVER_PORT) must be at most 65535, not 66051"),
    (("--artifact-port", "-1"), "--artifact-port (BREEZE_SERVER_ARTIFACT_PORT) must be at least 0, not -1"),
    (("--metrics-port", "70000"), "--metrics-port (BREEZE_SERVER_METRICS_PORT) must be at most 65535"),
    (("--advertise-artifact-address", "gpu-host:66052"), "--advertise-artifact-address "
     "(BREEZE_SERVER_ADVERTISED_ARTIFACT_ADDRESS) gpu-host:66052: clients dial it, so it needs a port, a number "
     "from 1 to 65535"),
    (("--advertise-artifact-address", "gpu-host"), "needs a port")])
def test_the_worker_refuses_a_port_outside_the_range(tmp_path, args, message):
    done = _run("breeze_worker.cli", "serve", "--device", "cpu", "--artifact-dir", str(tmp_path / "a"), *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "a").exists()
