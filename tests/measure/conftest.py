"""Fixtures for the measurement tools' tests: the tiny model (seeded random weights), built once."""

from __future__ import annotations

import pytest
import torch

from breeze_worker.model.loaded import LoadedModel
from breeze_worker.model.tiny import tiny_model


@pytest.fixture(scope="session")
def tiny_lm() -> LoadedModel:
    torch.set_num_threads(1)
    return tiny_model(seed=0, with_codec=False)


@pytest.fixture(scope="session")
def tiny_for_runs() -> LoadedModel:
    """For the commands that mask end of speech on the model they run (a change to the instance)."""
    return tiny_model(seed=0, with_codec=False)


@pytest.fixture(scope="session")
def tiny_with_codec() -> LoadedModel:
    return tiny_model(seed=0)
