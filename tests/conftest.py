"""Fixtures and hooks shared by every test directory: the order and grouping of a parallel run (run_layout.py),
tests marked `root` need root (host_tools.py), and the tests skipped for what the host lacks are listed at the
end of a run with what each needs."""

from __future__ import annotations

import contextlib

import pytest
import run_layout
from host_tools import SKIP_PREFIX, need_root

_lacking: list[tuple[str, str]] = []  # (test id, what it needs) for the tests skipped for the host


def pytest_collection_modifyitems(items):
    run_layout.arrange(items)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (scripts/test.sh runs the suite in parallel)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadfile":
        return run_layout.make_scheduler(config, log)
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") is not None:
        need_root("network namespaces, mounts or cgroups; CI runs as root")


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        if reason.startswith(SKIP_PREFIX):
            _lacking.append((report.nodeid, reason.removeprefix(SKIP_PREFIX)))


def pytest_terminal_summary(terminalreporter):
    if not _lacking:
        return
    terminalreporter.section(f"{len(_lacking)} test(s) skipped for what this host lacks (CI requires every tool "
                             "and root; the GPU tests run on a GPU host: benchmarks/device_run.py)")
    for nodeid, what in sorted(_lacking):
        terminalreporter.line(f"{nodeid}: needs {what}")


@pytest.fixture
def nan_frame_embedding():
    """`with nan_frame_embedding(lm, at=2) as calls:` the model's frame embedding (the backbone step's input)
    is NaN at its `at`-th call inside the block; `calls["n"]` counts the calls."""

    @contextlib.contextmanager
    def poison(lm, at: int = 2):
        calls = {"n": 0}
        original = lm.embed_frames

        def poisoned(codes):
            calls["n"] += 1
            out = original(codes)
            return out + float("nan") if calls["n"] == at else out

        lm.embed_frames = poisoned
        try:
            yield calls
        finally:
            del lm.embed_frames

    return poison


@pytest.fixture
def steer_logits(monkeypatch):
    """Rig a model's logits for the length of a test:
    - `steer_logits.nan_depth(lm, codebook=5, at=3)`: codebook `codebook`'s depth logits are NaN at their
      `at`-th computation (the third frame's);
    - `steer_logits.end_of_speech(model, at=3)`: the backbone's `at`-th read-out (the prefill's is the first)
      puts end of speech far ahead, so frame at - 1 ends the stream.
    Each returns the dict whose "n" counts the calls."""

    def nan_depth(lm, codebook: int = 5, at: int = 3) -> dict:
        calls = {"n": 0}
        original = lm.depth_logits

        def poisoned(hidden, position):
            out = original(hidden, position)
            if position == codebook:
                calls["n"] += 1
                if calls["n"] == at:
                    out = out + float("nan")
            return out

        monkeypatch.setattr(lm, "depth_logits", poisoned)
        return calls

    def end_of_speech(model, at: int = 3) -> dict:
        calls = {"n": 0}
        lm = model.lm
        original = lm.backbone_logits

        def steered(hidden):
            out = original(hidden)
            calls["n"] += 1
            if calls["n"] == at:
                out[..., model.config.end_of_speech_id] = 1e4
            return out

        monkeypatch.setattr(lm, "backbone_logits", steered)
        return calls

    return type("SteerLogits", (), {"nan_depth": staticmethod(nan_depth),
                                    "end_of_speech": staticmethod(end_of_speech)})
