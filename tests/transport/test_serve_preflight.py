"""`breeze-worker serve` refuses a port in use and bad TLS files with one line naming the flag and the remedy,
before gRPC binds (gRPC's own failure printed raw core log lines and blamed the port for a bad certificate).
The certificates are made by openssl."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from host_tools import need_tool

from breeze_worker.config import ServerSettings
from breeze_worker.transport.preflight import PreflightError, check_tls_files, port_in_use

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")),
           OMP_NUM_THREADS="1")


def _pair(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    subprocess.run([need_tool("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=60)
    return cert, key


@pytest.fixture(scope="module")
def pems(tmp_path_factory):
    d = tmp_path_factory.mktemp("pems")
    (cert, key), (_, other_key) = _pair(d, "a"), _pair(d, "b")
    junk = d / "junk.pem"
    junk.write_text("not a certificate\n")
    return {"cert": cert, "key": key, "other_key": other_key, "junk": junk, "missing": d / "missing.pem"}


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "breeze_worker.cli", "serve", "--device", "cpu",
                           "--artifact-dir", str(tmp_path / "artifacts"), *args],
                          capture_output=True, text=True, timeout=120, env=ENV)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    """The refusal: exit 1, no ready line, no traceback and none of gRPC's core log lines."""
    assert proc.returncode == 1 and "breeze-worker ready" not in proc.stdout, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if "TINY EMBEDDED DEFAULT" not in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr and ".cc:" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_port_in_use_is_named_with_its_flag(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert port_in_use("127.0.0.1", port) and not port_in_use("127.0.0.1", 0)
        line = _one_line(_serve(tmp_path, "--port", "0", "--artifact-port", str(port)))
    assert f"127.0.0.1:{port}" in line and "in use" in line and "--artifact-port" in line


def test_a_key_that_is_not_the_certificates_is_refused_before_binding(tmp_path, pems):
    line = _one_line(_serve(tmp_path, "--port", "0", "--artifact-port", "0", "--tls-cert", str(pems["cert"]),
                            "--tls-key", str(pems["other_key"])))
    assert f"--tls-key {pems['other_key']} is not the private key of --tls-cert {pems['cert']}" in line
    assert "port" not in line  # not blamed on the port, as gRPC's failure was


@pytest.mark.parametrize("case,words", [
    ({"tls_cert": "missing"}, "--tls-cert {missing}: no such file"),
    ({"tls_cert": "junk"}, "OpenSSL cannot read them as a PEM certificate chain"),
    ({"tls_key": "junk"}, "OpenSSL cannot read them as a PEM certificate chain"),
    ({"tls_client_ca": "junk"}, "--tls-client-ca {junk}: no PEM CA certificate in it"),
    ({"tls_client_ca": "missing"}, "--tls-client-ca {missing}: no such file"),
])
def test_each_bad_tls_file_is_named(pems, case, words):
    chosen = {"tls_cert": pems["cert"], "tls_key": pems["key"], "tls_client_ca": None,
              **{k: pems[v] for k, v in case.items()}}
    with pytest.raises(PreflightError) as info:
        check_tls_files(ServerSettings(**chosen))
    assert words.format(**pems) in str(info.value)


def test_good_tls_files_pass(pems):
    check_tls_files(ServerSettings(tls_cert=pems["cert"], tls_key=pems["key"], tls_client_ca=pems["cert"]))
