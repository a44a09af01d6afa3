"""The profiling commands' failures: a bad flag, an unreadable checkpoint or an invalid request is one line on
stderr and exit 2 (never a traceback, and for audit-syncs never exit 1, which means "over budget")."""

from __future__ import annotations

import pytest

from breeze_worker.cli import main as worker_main
from breeze_worker.commands.audit_syncs import EXIT_OVER_BUDGET, EXIT_USAGE

COMMANDS = {
    "audit-syncs": ["audit-syncs", "--device", "cpu"],
    "trace": ["trace", "--device", "cpu", "--trace", "{tmp}/trace.json"],
    "precision-check": ["precision-check", "--device", "cpu", "--policies", "fp32"],
}


def _run(name: str, tmp_path, *flags: str) -> int:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in COMMANDS[name]]
    return worker_main([*argv, *flags])


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    assert err[-1].startswith(f"breeze-worker {command}: ")
    return err[-1]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_missing_checkpoint_is_one_line_and_exit_2(command, tmp_path, capsys):
    missing = tmp_path / "no-such-checkpoint"
    assert _run(command, tmp_path, "--model", str(missing)) == 2
    line = _one_line(capsys, command)
    assert str(missing) in line and "config.json" in line


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_zero_frames_is_a_usage_error(command, tmp_path, capsys):
    assert _run(command, tmp_path, "--frames", "0") == 2
    assert "--frames" in _one_line(capsys, command)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_invalid_request_is_one_line_and_exit_2(command, tmp_path, capsys, monkeypatch, tiny_for_runs):
    """The request is refused by resolve_request (InvalidRequest, a BreezeError), not by a flag check."""
    monkeypatch.setattr("breeze_worker.measure.setup.load_model",
                        lambda args, device, precision=None: tiny_for_runs)
    assert _run(command, tmp_path, "--frames", "2", "--text", "   ") == 2
    assert "text is empty" in _one_line(capsys, command)


def test_audit_rejects_a_negative_budget_with_the_usage_exit(tmp_path, capsys):
    assert EXIT_USAGE != EXIT_OVER_BUDGET
    assert _run("audit-syncs", tmp_path, "--budget", "-1") == EXIT_USAGE
    assert "--budget" in _one_line(capsys, "audit-syncs")
