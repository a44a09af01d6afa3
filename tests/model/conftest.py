"""Shared fixtures: one tiny model per session (seeded random weights, in-code tokenizer, no codec)."""

from __future__ import annotations

import pytest

from breeze_worker.model.loaded import LoadedModel
from breeze_worker.model.tiny import tiny_model


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return tiny_model(seed=0, with_codec=False)
