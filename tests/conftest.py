"""Fixtures shared by every test directory."""

from __future__ import annotations

import contextlib

import pytest


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
