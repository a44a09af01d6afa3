"""Compile bundles (engine/bundle.py, `breeze-worker compile`, `serve --compile-bundle`) on the CPU:

- PyTorch's cache artifacts carried by a bundle make a fresh process's Inductor compile of the same function
  a cache hit (AOT autograd's and Inductor's), in processes of their own with caches of their own;
- a bundle whose key differs, that is truncated, longer than written, corrupt or not a bundle at all is refused
  with one log line naming why, and installs nothing; a worker given one starts and serves as without it;
- the compile command writes a bundle for the settings it is given, and a worker with the same settings
  installs it while one with other settings refuses it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from breeze_worker.engine import bundle as bundles

ROOT = Path(__file__).resolve().parents[2]
KEY = {"format": 1, "device": "cuda", "compute_capability": "9.0", "torch": "2.11.0", "model": "abc",
       "max_active_streams": 8, "fastpath": {"compile": "auto", "form": "auto"}}


def _parts(tmp_path) -> dict[str, bytes]:
    forms = tmp_path / "built-forms"
    forms.mkdir()
    (forms / "codec-forms-0123.json").write_text('{"identity": {}, "forms": {"a|1,2": true}}')
    return {bundles.TORCH_CACHE: b"torch cache artifacts" * 100, bundles.TRITON_CACHE: b"",
            bundles.CODEC_FORMS: bundles._tar_of(forms, pattern="codec-forms-*.json")}


def _refused(caplog, path, key=KEY) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="breeze_worker.engine.bundle"):
        assert bundles.open_bundle(path, key) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "breeze_worker.engine.bundle"]
    assert len(lines) == 1 and "not used" in lines[0] and "compiling as without a bundle" in lines[0], lines
    return lines[0]


def test_a_bundle_round_trips_and_installs_only_what_the_caches_lack(tmp_path, monkeypatch):
    path = tmp_path / "b.bundle"
    parts = _parts(tmp_path)
    header = bundles.write_bundle(path, KEY, parts, {"host": "builder"})
    assert [p["name"] for p in header["parts"]] == list(parts)
    got_header, got = bundles.read_bundle(path)
    assert got == parts and got_header["key"] == KEY and got_header["built_by"] == {"host": "builder"}
    target = tmp_path / "forms-here"
    monkeypatch.setattr(bundles, "forms_dir", lambda: target)
    opened = bundles.open_bundle(path, json.loads(json.dumps(KEY)))
    assert opened is not None
    assert opened.install((bundles.CODEC_FORMS,)) == {bundles.CODEC_FORMS: 1}
    assert json.loads((target / "codec-forms-0123.json").read_text())["forms"] == {"a|1,2": True}
    # a file already there is never replaced
    (target / "codec-forms-0123.json").write_text("mine")
    again = bundles.open_bundle(path, KEY)
    assert again is not None and again.install((bundles.CODEC_FORMS,)) == {bundles.CODEC_FORMS: 0}
    assert (target / "codec-forms-0123.json").read_text() == "mine"


def test_a_bundle_for_another_host_or_other_settings_is_refused_naming_the_difference(tmp_path, caplog):
    path = tmp_path / "b.bundle"
    bundles.write_bundle(path, KEY, _parts(tmp_path))
    line = _refused(caplog, path, {**KEY, "compute_capability": "7.5",
                                   "fastpath": {**KEY["fastpath"], "form": "gemm"}})
    assert "compute_capability: bundle '9.0', this worker '7.5'" in line
    assert "fastpath.form: bundle 'auto', this worker 'gemm'" in line


@pytest.mark.parametrize("damage, why", [
    ("truncated", "truncated"), ("appended", "longer than written"), ("flipped", "corrupt"),
    ("header", "header is unreadable"), ("foreign", "not a compile bundle"), ("empty", "not a compile bundle"),
    ("missing", "cannot read it"),
])
def test_a_damaged_bundle_is_refused_and_installs_nothing(tmp_path, caplog, monkeypatch, damage, why):
    path = tmp_path / "b.bundle"
    bundles.write_bundle(path, KEY, _parts(tmp_path))
    data = path.read_bytes()
    header_end = data.index(b"\n", len(bundles.MAGIC)) + 1
    damaged = {"truncated": data[:-7], "appended": data + b"x", "header": data[:header_end - 30] + data[header_end:],
               "flipped": data[:header_end + 50] + bytes([data[header_end + 50] ^ 1]) + data[header_end + 51:],
               "foreign": b"PK\x03\x04" + data, "empty": b""}
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(damaged[damage])
    target = tmp_path / "forms-here"
    monkeypatch.setattr(bundles, "forms_dir", lambda: target)
    assert why in _refused(caplog, path)
    assert not target.exists()


def test_a_worker_given_a_damaged_or_foreign_bundle_starts_and_serves(tmp_path, caplog):
    from breeze_worker.config import EngineSettings
    from breeze_worker.engine.runtime import Runtime

    path = tmp_path / "b.bundle"
    bundles.write_bundle(path, KEY, _parts(tmp_path))  # another host's key
    caplog.set_level(logging.WARNING, logger="breeze_worker.engine.bundle")
    runtime = Runtime.load(EngineSettings(device="cpu", compile_bundle=path))
    assert runtime.bundle is None and "built for another kind of host" in caplog.text
    path.write_bytes(path.read_bytes()[:100])
    runtime = Runtime.load(EngineSettings(device="cpu", compile_bundle=path))
    assert runtime.bundle is None and "truncated" in caplog.text
    assert runtime.readiness()["ready_streams"] == 8


_INDUCTOR = textwrap.dedent("""
    import json, sys, torch
    from pathlib import Path
    from torch._dynamo.utils import counters
    from breeze_worker.engine import bundle as bundles

    def f(x, y):
        return (torch.sin(x) * y + x.exp()).sum(-1)

    mode, path = sys.argv[1], Path(sys.argv[2])
    key = {"format": 1, "device": "cpu", "torch": torch.__version__}
    if mode == "load":
        opened = bundles.open_bundle(path, key)
        installed = opened.install() if opened is not None else None
    out = torch.compile(f, fullgraph=True, dynamic=False)(torch.ones(4, 8), torch.full((4, 8), 2.0))
    if mode == "save":
        bundles.write_bundle(path, key, bundles.collect_parts())
    print(json.dumps({"out": out.tolist(), "installed": installed if mode == "load" else None,
                      **{k: dict(v) for k, v in counters.items() if k in ("inductor", "aot_autograd")}}))
""")


def test_a_fresh_process_compiles_from_the_bundle_of_another(tmp_path):
    """Inductor on the CPU: process one compiles a function and writes the bundle; process two, with empty
    caches of its own, installs it and compiles the same function: AOT autograd and Inductor hit their caches,
    no miss, same result."""
    path = tmp_path / "cpu.bundle"
    docs = []
    for mode in ("save", "load"):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{mode}"),
               "TRITON_CACHE_DIR": str(tmp_path / f"triton-{mode}"), "TORCHINDUCTOR_COMPILE_THREADS": "1",
               "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-c", _INDUCTOR, mode, str(path)], capture_output=True, text=True,
                              timeout=900, env=env, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        docs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    saved, loaded = docs
    assert saved["inductor"].get("fxgraph_cache_miss") == 1
    assert loaded["installed"][bundles.TORCH_CACHE] >= 2  # the Inductor graph and its AOT autograd entry
    assert loaded["inductor"].get("fxgraph_cache_hit") == 1 and not loaded["inductor"].get("fxgraph_cache_miss")
    assert loaded["aot_autograd"].get("autograd_cache_hit") == 1
    assert loaded["out"] == saved["out"]


def test_the_compile_command_writes_a_bundle_a_worker_with_its_settings_installs(tmp_path, caplog):
    from breeze_worker.config import EngineSettings
    from breeze_worker.engine.runtime import Runtime

    path = tmp_path / "tiny.bundle"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "breeze_worker.cli", "compile", "--device", "cpu", "--fast-path",
                           "fast", "--max-active-streams", "3", "--out", str(path)], capture_output=True, text=True,
                          timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {path}: compile bundle of" in proc.stdout and "3 streams, precision fp32" in proc.stdout
    header, _ = bundles.read_bundle(path)
    assert header["key"]["max_active_streams"] == 3 and header["key"]["device"] == "cpu"
    caplog.set_level(logging.INFO, logger="breeze_worker.engine.bundle")
    same = Runtime.load(EngineSettings(device="cpu", fast_path="fast", max_active_streams=3, compile_bundle=path))
    assert same.bundle is not None and "not used" not in caplog.text
    caplog.clear()
    other = Runtime.load(EngineSettings(device="cpu", fast_path="fast", max_active_streams=4, compile_bundle=path))
    assert other.bundle is None and "max_active_streams: bundle 3, this worker 4" in caplog.text
