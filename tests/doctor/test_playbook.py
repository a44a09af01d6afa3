"""docs/t4-playbook.md's cost table is the doctor's own projection for the full-size model: regenerate it with
`markdown_classes` when the figures change."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from breeze_worker.cli import build_parser
from breeze_worker.doctor.report import class_figures, markdown_classes
from breeze_worker.doctor.verdict import class_row
from breeze_worker.model.synthetic import config_for

PLAYBOOK = Path(__file__).resolve().parents[2] / "docs" / "t4-playbook.md"


def test_the_playbook_table_is_the_doctors_projection():
    text = PLAYBOOK.read_text()
    start, end = "<!-- doctor:classes -->\n", "\n<!-- /doctor:classes -->"
    table = text[text.index(start) + len(start):text.index(end)]
    rows = [class_row(fig) for fig in class_figures(config_for("full"))]
    assert table == markdown_classes(rows)


def test_the_playbook_t4_options_table_is_the_doctors_projection():
    from breeze_worker.doctor.report import markdown_options, t4_options

    text = PLAYBOOK.read_text()
    start, end = "<!-- doctor:t4-options -->\n", "\n<!-- /doctor:t4-options -->"
    table = text[text.index(start) + len(start):text.index(end)]
    assert table == markdown_options(t4_options(config_for("full")))


def test_every_worker_command_in_the_playbook_parses():
    """Each `breeze-worker ...` line the playbook tells a user to run is accepted by the real parser."""
    text = PLAYBOOK.read_text()
    inline = re.findall(r"`(breeze-worker [^`]+)`", re.sub(r"\s*\n\s*", " ", text))
    blocks = [line.strip() for line in text.splitlines() if line.strip().startswith("breeze-worker ")]
    commands = {c for c in inline + blocks if "..." not in c.split("=")[0]}
    assert {c.split()[1] for c in commands} >= {"doctor", "precision-check", "bench", "audit-syncs", "trace", "serve"}
    for command in commands:
        argv = shlex.split(command)[1:]
        build_parser(argv).parse_args(argv)  # argparse exits (a failed test) on an unknown flag or choice
