"""Fixtures for the fast-path tests: a fresh tiny model per test module (the fast path packs weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from breeze_worker.engine.fastpath.graph import clear_runners
from breeze_worker.engine.request import resolve_request
from breeze_worker.engine.types import SynthesisRequest
from breeze_worker.model.tiny import tiny_model


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    clear_runners()
    yield tiny_model(seed=0, with_codec=False)
    clear_runners()


@pytest.fixture
def request_for():
    return _request_for


def _request_for(model, cfg: bool, frames: int = 6, seed: int = 7):
    req = SynthesisRequest(text="hello there", instruction="calm and slow" if cfg else None,
                           cfg_scale=2.0 if cfg else None, seed=seed, max_frames=frames)
    return resolve_request(req, model.generation_defaults, None, tokenizer=model.tokenizer)


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def interpreter_check():
    """Run a tests/fastpath script under Triton's interpreter in a subprocess (the interpreter must be chosen
    before Triton is imported); returns its JSON lines, asserting it exited 0."""
    def run(script: str) -> list[dict]:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "worker")}
        done = subprocess.run([sys.executable, str(ROOT / "tests/fastpath" / script)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    return run
