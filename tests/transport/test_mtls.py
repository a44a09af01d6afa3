"""Mutual TLS with certificates made by openssl: the worker (--tls-client-ca) accepts a client certificate signed
by its CA on both ports and refuses a client without one or with one from another CA; the SDK and the CLI
present theirs with --tls-cert/--tls-key."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from host_tools import need_tool
from transport_helpers import TOKEN, worker_settings

from breeze_client.aio import AsyncBreezeClient
from breeze_client.channel import ConnectionOptions
from breeze_client.errors import BreezeClientError, Unauthenticated
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.transport.server import create_server

ROOT = Path(__file__).resolve().parents[2]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
             "-keyout", str(key), "-out", str(cert))
    return cert, key


def _signed(directory: Path, name: str, ca: tuple[Path, Path], extension: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (directory / f"{name}{s}" for s in (".key", ".csr", ".pem", ".ext"))
    ext.write_text(extension + "\n")
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key),
             "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "1", "-extfile", str(ext), "-out", str(cert))
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two CAs; the worker's certificate and one client certificate from CA 'trusted', one from 'stranger'."""
    need_tool("openssl")
    d = tmp_path_factory.mktemp("pki")
    trusted, stranger = _ca(d, "trusted-ca"), _ca(d, "stranger-ca")
    return {
        "ca": trusted[0],
        "server": _signed(d, "worker", trusted, "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                                "extendedKeyUsage=serverAuth"),
        "client": _signed(d, "client", trusted, "extendedKeyUsage=clientAuth"),
        "stranger": _signed(d, "client-of-another-ca", stranger, "extendedKeyUsage=clientAuth"),
    }


@pytest.fixture
async def mtls_worker(tmp_path, pki):
    cert, key = pki["server"]
    settings = worker_settings(tmp_path, tls_cert=cert, tls_key=key, tls_client_ca=pki["ca"], auth_token=TOKEN)
    store = ArtifactStore(settings.artifacts)
    servers = await create_server(settings, FakeEngine(store), store)
    yield servers
    await servers.stop(0)


def _options(servers, pki, client: str | None, **kw) -> ConnectionOptions:
    cert, key = pki[client] if client else (None, None)
    return ConnectionOptions(target=f"localhost:{servers.synthesis_port}",
                             artifact_target=f"localhost:{servers.artifact_port}", tls_ca=pki["ca"],
                             tls_cert=cert, tls_key=key, timeout_s=10, **kw)


async def test_a_client_certificate_from_the_worker_ca_is_accepted_on_both_ports(mtls_worker, pki):
    async with AsyncBreezeClient(options=_options(mtls_worker, pki, "client", token=TOKEN)) as client:
        result = await client.synthesize("over mutual TLS")
        fetched = await client.fetch(result.artifact)  # the artifact port
        assert fetched.verified and fetched.data.endswith(result.audio)
    # the token is still checked on top of the certificate
    async with AsyncBreezeClient(options=_options(mtls_worker, pki, "client")) as client:
        with pytest.raises(Unauthenticated):
            await client.worker_info()


@pytest.mark.parametrize("client", [None, "stranger"], ids=["no-certificate", "another-ca"])
async def test_a_client_without_a_certificate_of_the_worker_ca_is_refused(mtls_worker, pki, client):
    for port in (mtls_worker.synthesis_port, mtls_worker.artifact_port):
        opts = replace(_options(mtls_worker, pki, client, token=TOKEN), target=f"localhost:{port}")
        async with AsyncBreezeClient(options=opts) as c:
            with pytest.raises(BreezeClientError) as refused:
                await c.health()  # even the open health service: the handshake fails first
            assert refused.value.code == "UNAVAILABLE"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")))
    return subprocess.run([sys.executable, "-m", "breeze_client.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


async def test_the_cli_presents_its_certificate_with_tls_cert_and_tls_key(mtls_worker, pki):
    target = f"localhost:{mtls_worker.synthesis_port}"
    common = ("health", "--target", target, "--artifact-target", f"localhost:{mtls_worker.artifact_port}",
              "--tls-ca", str(pki["ca"]), "--token", TOKEN, "--timeout", "10", "--json", "-")
    ok = await asyncio.to_thread(_cli, *common, "--tls-cert", str(pki["client"][0]), "--tls-key",
                                 str(pki["client"][1]))
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["synthesis"]["status"] == "SERVING" and report["artifacts"]["status"] == "SERVING"
    stranger = await asyncio.to_thread(_cli, *common, "--tls-cert", str(pki["stranger"][0]), "--tls-key",
                                       str(pki["stranger"][1]))
    assert stranger.returncode == 1 and "UNAVAILABLE" in stranger.stderr
    half = await asyncio.to_thread(_cli, *common, "--tls-cert", str(pki["client"][0]))
    assert half.returncode == 1 and half.stderr.startswith("error: INVALID_ARGUMENT: ") and "--tls-key" in half.stderr
