"""Status codes -> SDK exceptions; the CLI's shared connection flags; the streaming WAV writer."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import soundfile as sf

from breeze_client import cli, errors
from breeze_client.wav import StreamingWavWriter


class _Err(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code,cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument), (grpc.StatusCode.NOT_FOUND, errors.NotFound),
    (grpc.StatusCode.OUT_OF_RANGE, errors.OutOfRange), (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
    (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated), (grpc.StatusCode.INTERNAL, errors.Internal),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted)])
def test_each_status_becomes_its_exception_with_code_and_message(code, cls):
    exc = errors.from_rpc_error(_Err(code, "change this"))
    assert type(exc) is cls and exc.code == code.name and exc.message == "change this"
    assert str(exc) == f"{code.name}: change this"


def test_oversized_request_says_what_to_change():
    exc = errors.from_rpc_error(_Err(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (9 vs. 4)"))
    assert isinstance(exc, errors.RequestTooLarge) and "shorter reference" in exc.message


def test_unknown_status_keeps_its_name():
    exc = errors.from_rpc_error(_Err(grpc.StatusCode.ABORTED, "x"))
    assert type(exc) is errors.BreezeClientError and exc.code == "ABORTED"


def _subparser(command: str):
    parser = cli.build_parser([command])
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[command]


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_registered_subcommand_gets_the_connection_flags(command):
    flags = set(_subparser(command)._option_string_actions)
    assert {"--target", "--artifact-target", "--tls-ca", "--token", "--timeout", "--json"} <= flags


@pytest.mark.parametrize("command", ["synth", "fetch", "health"])
def test_every_subcommand_parses_the_same_connection_flags(command, tmp_path):
    extra = {"synth": ["hello"], "fetch": ["art-x", "-o", "f.wav"], "health": []}[command]
    ca = tmp_path / "ca.pem"
    ca.write_text("roots")
    argv = [command, *extra, "--target", "h:1", "--artifact-target", "h:2", "--tls-ca", str(ca),
            "--token", "t", "--timeout", "3", "--json", "out.json"]
    args = cli.build_parser(argv).parse_args(argv)
    opts = cli.connection_options(args)
    assert (opts.target, opts.artifact_target, opts.tls_ca, opts.token, opts.timeout_s, args.json) == \
        ("h:1", "h:2", ca, "t", 3.0, "out.json")
    assert opts.uses_tls and opts.metadata == (("authorization", "Bearer t"),)


def test_a_failed_call_exits_non_zero_with_code_and_message(capsys):
    code = cli.main(["health", "--target", "127.0.0.1:1", "--timeout", "2"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: UNAVAILABLE: ")


def test_ctrl_c_prints_interrupted_and_exits_130_without_a_traceback(monkeypatch, capsys):
    class Interrupted:
        @staticmethod
        def add_arguments(parser):
            pass

        @staticmethod
        def run(args, options):
            raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_load", lambda name: Interrupted)
    code = cli.main(["health"])
    err = capsys.readouterr().err
    assert code == 130 and err.strip() == "interrupted"


def test_the_workers_own_too_large_message_is_kept_as_is():
    details = "the request is 9 bytes; this worker accepts at most 4 (its --max-request-bytes): send ..."
    exc = errors.from_rpc_error(_Err(grpc.StatusCode.RESOURCE_EXHAUSTED, details))
    assert isinstance(exc, errors.RequestTooLarge) and exc.message == details


@pytest.mark.parametrize("encoding", ["s16le", "f32le"])
def test_streaming_wav_writer_produces_a_valid_wav_of_the_exact_pcm(tmp_path, encoding):
    x = np.linspace(-0.5, 0.5, 999, dtype=np.float32)
    pcm = (x * 32767).astype("<i2").tobytes() if encoding == "s16le" else x.astype("<f4").tobytes()
    w = StreamingWavWriter(tmp_path / "a.wav", encoding, 24000)
    for i in range(0, len(pcm), 100 * (2 if encoding == "s16le" else 4)):
        w.write(pcm[i:i + 100 * (2 if encoding == "s16le" else 4)])
    assert w.close() > 0
    data, rate = sf.read(tmp_path / "a.wav", dtype="int16" if encoding == "s16le" else "float32")
    assert rate == 24000 and data.tobytes() == pcm


@pytest.mark.parametrize("argv,flag", [
    (["synth", "Hi.", "--ref-audio", "{tmp}/missing.wav", "--ref-text", "hi"], "--ref-audio {tmp}/missing.wav"),
    (["synth", "Hi.", "-o", "{tmp}/no-such-dir/out.wav"], "-o {tmp}/no-such-dir/out.wav"),
    (["synth", "Hi.", "-o", "{tmp}"], "-o {tmp}: is a directory"),
    (["fetch", "art-x", "-o", "{tmp}/no-such-dir/out.wav"], "-o {tmp}/no-such-dir/out.wav"),
    (["bench", "--clone-every", "2", "--reference", "{tmp}/missing.wav", "--reference-text", "hi"],
     "--reference {tmp}/missing.wav"),
    (["bench", "--clone-every", "2"], "--clone-every needs --reference"),
    (["diagnose", "--report", "{tmp}/no-such-dir/r.html"], "--report {tmp}/no-such-dir/r.html"),
    (["health", "--tls-ca", "{tmp}/missing.pem"], "--tls-ca {tmp}/missing.pem: no such file"),
])
def test_local_files_are_checked_before_any_call(argv, flag, tmp_path, capsys):
    """Nothing listens at the target: a refusal naming the flag (not UNAVAILABLE) shows the file was checked
    first, so no job runs only to fail at the end; `error: CODE: message` and exit 1 as for a failed call."""
    argv = [a.format(tmp=tmp_path) for a in argv]
    code = cli.main([*argv, "--target", "127.0.0.1:1", "--timeout", "5"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: INVALID_ARGUMENT: "), err
    assert flag.format(tmp=tmp_path) in err and "UNAVAILABLE" not in err


def test_json_to_a_file_keeps_the_text_and_json_to_stdout_is_only_the_document(monkeypatch, capsys, tmp_path):
    class Reporting:
        @staticmethod
        def add_arguments(parser):
            pass

        @staticmethod
        def run(args, options):
            from breeze_client.jsonout import write

            write({"ok": True}, args.json)
            print("a table for people")
            return 0

    monkeypatch.setattr(cli, "_load", lambda name: Reporting)
    assert cli.main(["health", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr()
    assert out.out == "a table for people\n" and json.loads((tmp_path / "r.json").read_text()) == {"ok": True}
    assert cli.main(["health", "--json", "-"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"ok": True} and out.err == "a table for people\n"
