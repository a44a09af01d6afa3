"""What a worker's start imports before it serves (the trimmed start-up): loading a checkpoint and building the
runtime for serving import neither transformers (the reference encoder's, read once serving) nor torch's compiler
stack (Dynamo, Inductor, sympy: the progressive start compiles nothing before serving), and the codec's forms
directory is Inductor's cache directory as Inductor's own helper computes it, without importing Inductor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("transformers", "torch._dynamo", "torch._inductor", "sympy")


def _run(code: str, env: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("worker", "client", "protos")),
           "OMP_NUM_THREADS": "1", **(env or {})}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_building_the_runtime_for_serving_imports_no_transformers_and_no_compiler(tmp_path):
    checkpoint = tmp_path / "ckpt"
    subprocess.run([sys.executable, "-m", "breeze_worker.cli", "make-checkpoint", "--size", "tiny", str(checkpoint)],
                   check=True, capture_output=True, timeout=600,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "worker")})
    code = f"""
import json, sys
from breeze_worker.config import EngineSettings
from breeze_worker.engine.runtime import Runtime
runtime = Runtime.load(EngineSettings(device="cpu", fast_path="fast", model_dir={str(checkpoint)!r}))
print(json.dumps({{"imported": [m for m in {HEAVY!r} if m in sys.modules],
                  "encoder_loaded": runtime.codec.encoder_loaded, "ready": runtime.ready_streams}}))
"""
    doc = _run(code)
    assert doc == {"imported": [], "encoder_loaded": False, "ready": 8}


@pytest.mark.parametrize("configured", [None, "inductor-here"])
def test_the_forms_directory_is_inductors_cache_directory_without_importing_inductor(tmp_path, configured):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / configured)} if configured else {}
    if not configured:
        env["TORCHINDUCTOR_CACHE_DIR"] = ""  # unset below
    code = """
import json, os, sys
if os.environ.get("TORCHINDUCTOR_CACHE_DIR") == "":
    del os.environ["TORCHINDUCTOR_CACHE_DIR"]
from breeze_worker.engine.codec_graphs import forms_directory
ours = str(forms_directory())
imported = [m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules]
from torch._inductor.runtime.cache_dir_utils import cache_dir
print(json.dumps({"ours": ours, "inductor": os.path.join(cache_dir(), "breeze"), "imported": imported}))
"""
    doc = _run(code, env)
    assert doc["ours"] == doc["inductor"] and doc["imported"] == []
    if configured:
        assert doc["ours"] == str(tmp_path / configured / "breeze")
