"""`breeze-worker serve` flags come from the typed settings: environment first, flags over it."""

import argparse

import pytest
from transport_helpers import TOKEN

from breeze_worker.commands.serve import add_arguments, settings_from_args
from breeze_worker.config import SettingsError, WorkerSettings, setting_fields


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_override_the_environment_and_switches_default_to_it():
    env = {"BREEZE_ENGINE_FORCE_PRECISION": "true", "BREEZE_ENGINE_MAX_QUEUE": "5"}
    from_env = settings_from_args(parse(), env)
    assert from_env.engine.force_precision is True and from_env.engine.max_queue == 5
    flagged = settings_from_args(parse("--max-queue", "9", "--min-reference-seconds", "2.5",
                                       "--reference-cache-entries", "3", "--precision", "bf16"), {})
    assert flagged.engine.max_queue == 9 and flagged.engine.min_reference_seconds == 2.5
    assert flagged.engine.reference_cache_entries == 3 and flagged.engine.precision == "bf16"
    assert flagged.engine.force_precision is False
    assert settings_from_args(parse("--force-precision"), {}).engine.force_precision is True


def test_invalid_values_say_what_to_change():
    with pytest.raises(SettingsError, match=r"--min-reference-seconds \(BREEZE_ENGINE_MIN_REFERENCE_SECONDS\) must "
                                            r"be at most --max-reference-seconds \(BREEZE_ENGINE_MAX_REFERENCE_"):
        settings_from_args(parse("--min-reference-seconds", "40"), {})
    with pytest.raises(SettingsError, match=r"--precision \(BREEZE_ENGINE_PRECISION\) must be auto, fp32, bf16 or "
                                            r"fp16-mixed, not 'fp8'"):
        settings_from_args(parse("--precision", "fp8"), {})
    with pytest.raises(SettingsError, match=r"--max-queue \(BREEZE_ENGINE_MAX_QUEUE\) must be at least 1, not 0"):
        settings_from_args(parse(), {"BREEZE_ENGINE_MAX_QUEUE": "0"})
    with pytest.raises(SettingsError, match=r"BREEZE_ENGINE_MAX_QUEUE='lots' \(--max-queue\): 'lots' is not a whole"):
        settings_from_args(parse(), {"BREEZE_ENGINE_MAX_QUEUE": "lots"})
    with pytest.raises(SettingsError, match=r"--max-stream-buffer-bytes \(BREEZE_SERVER_MAX_STREAM_BUFFER_BYTES\) "
                                            r"must be at least 65536"):
        settings_from_args(parse("--max-stream-buffer-bytes", "1000"), {})


def test_a_flag_replaces_its_variable_before_the_value_is_checked():
    assert settings_from_args(parse("--max-queue", "5"), {"BREEZE_ENGINE_MAX_QUEUE": "0"}).engine.max_queue == 5


def test_an_unparsable_flag_is_a_usage_error_naming_its_variable(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("--max-queue", "lots")
    assert exit_info.value.code == 2
    assert "argument --max-queue: 'lots' is not a whole number (the variable: BREEZE_ENGINE_MAX_QUEUE)" \
        in capsys.readouterr().err


def test_a_default_on_switch_can_be_turned_off_from_the_command_line():
    assert settings_from_args(parse(), {}).engine.codec_tf32 is True
    assert settings_from_args(parse("--no-codec-tf32"), {}).engine.codec_tf32 is False
    assert settings_from_args(parse(), {"BREEZE_ENGINE_CODEC_TF32": "0"}).engine.codec_tf32 is False
    assert settings_from_args(parse("--codec-tf32"), {"BREEZE_ENGINE_CODEC_TF32": "off"}).engine.codec_tf32 is True
    assert settings_from_args(parse("--no-fused-chained"), {}).engine.fastpath.kernels.chained is False
    got = settings_from_args(parse("--fastpath-form", "GEMM", "--fastpath-compile", "1", "--fused-plans",
                                   '{"sample": {"num_warps": 4}}'), {}).engine.fastpath
    assert (got.form, got.compile, dict(got.kernels.plans)) == ("gemm", "on", {"sample": {"num_warps": 4}})


def test_every_setting_has_one_flag_and_one_variable_shown_in_help():
    fields = setting_fields(WorkerSettings)
    assert len({f.flag for f in fields}) == len({f.env for f in fields}) == len(fields)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for f in fields:
        if f.spec.hidden:  # the test-only faults: accepted, not advertised
            assert f.flag not in text and f.env not in text
            assert parser.parse_args([f.flag, "1"]) is not None
        else:
            assert f.flag in text and f.env in text


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_a_loopback_listener_needs_no_authentication(host):
    assert settings_from_args(parse("--host", host), {}).server.listens_on_loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gpu-host.example"])
def test_a_non_loopback_listener_needs_a_token_client_certificates_or_allow_insecure(host, tmp_path):
    with pytest.raises(ValueError, match=f"refusing to listen on {host} without authentication"):
        settings_from_args(parse("--host", host), {})
    assert settings_from_args(parse("--host", host), {"BREEZE_SERVER_AUTH_TOKEN": TOKEN}).server.auth_token == TOKEN
    assert settings_from_args(parse("--host", host, "--allow-insecure"), {}).server.allow_insecure
    pem = [str(tmp_path / name) for name in ("cert.pem", "key.pem", "ca.pem")]
    mtls = settings_from_args(parse("--host", host, "--tls-cert", pem[0], "--tls-key", pem[1],
                                    "--tls-client-ca", pem[2]), {})
    assert str(mtls.server.tls_client_ca) == pem[2]


def test_client_certificates_need_tls():
    with pytest.raises(ValueError, match="--tls-client-ca .* needs TLS"):
        settings_from_args(parse("--tls-client-ca", "ca.pem"), {})


def test_the_systemd_unit_cannot_start_an_exposed_worker_without_its_token_file():
    from pathlib import Path

    unit = (Path(__file__).resolve().parents[2] / "ops/systemd/breeze-worker.service").read_text()
    exec_start = unit.split("ExecStart=", 1)[1].split("\n[", 1)[0]
    host = exec_start.split("--host", 1)[1].split()[0] if "--host" in exec_start else "127.0.0.1"
    env_files = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("EnvironmentFile=")]
    if host not in ("127.0.0.1", "localhost", "::1"):
        assert env_files and not any(f.startswith("-") for f in env_files), \
            "the env file holding BREEZE_SERVER_AUTH_TOKEN must be required ('-' makes it optional)"
        assert "--allow-insecure" not in exec_start


def test_the_metrics_listener_has_a_host_flag_of_its_own():
    settings = settings_from_args(parse("--metrics-port", "0", "--metrics-host", "127.0.0.2"), {})
    assert settings.server.metrics_host == "127.0.0.2" and settings.server.metrics_port == 0
    assert settings_from_args(parse("--metrics-port", "0"), {}).server.metrics_host is None  # --host's value
    with pytest.raises(ValueError, match=r"--metrics-port \(BREEZE_SERVER_METRICS_PORT\) must be at most 65535"):
        settings_from_args(parse("--metrics-port", "70000"), {})
