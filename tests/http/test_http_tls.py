"""The HTTP face under the gRPC ports' TLS and client certificates (--tls-cert, --tls-key, --tls-client-ca): a
client with a certificate of the worker's CA is served, one without or with another CA's certificate never gets
past the handshake. Certificates made by openssl, as tests/transport/test_mtls.py makes them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import requests
from host_tools import need_tool
from served_http import ServedHttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transport"))
from test_mtls import _ca, _signed  # noqa: E402  (the transport tests' openssl helpers)


@pytest.fixture(scope="module")
def mtls_http(tmp_path_factory):
    need_tool("openssl")
    d = tmp_path_factory.mktemp("pki")
    trusted, stranger = _ca(d, "trusted-ca"), _ca(d, "stranger-ca")
    server = _signed(d, "worker", trusted, "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    pki = {"ca": trusted[0], "client": _signed(d, "client", trusted, "extendedKeyUsage=clientAuth"),
           "stranger": _signed(d, "other", stranger, "extendedKeyUsage=clientAuth")}
    with ServedHttp(tmp_path_factory.mktemp("artifacts"), "--tls-cert", str(server[0]), "--tls-key", str(server[1]),
                    "--tls-client-ca", str(pki["ca"])) as worker:
        yield worker, pki


def test_a_client_certificate_of_the_workers_ca_is_served(mtls_http):
    worker, pki = mtls_http
    assert worker.base.startswith("https://")
    cert = tuple(str(p) for p in pki["client"])
    reply = requests.post(worker.url("/v1/audio/speech"), data={"text": "Over TLS."}, cert=cert,
                          verify=str(pki["ca"]), timeout=300)
    assert reply.status_code == 200 and len(reply.content) > 0 and reply.headers["X-Job-Id"].startswith("job-")


@pytest.mark.parametrize("client", [None, "stranger"])
def test_a_client_without_a_trusted_certificate_never_gets_past_the_handshake(mtls_http, client):
    worker, pki = mtls_http
    cert = tuple(str(p) for p in pki[client]) if client else None
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        requests.get(worker.url("/health"), cert=cert, verify=str(pki["ca"]), timeout=60)
