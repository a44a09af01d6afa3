"""What a user installs: the SDK's public names, the version from the package metadata, the typing markers in
the built wheel, and one set of pinned torch/triton versions used by every installer."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import breeze_client

ROOT = Path(__file__).resolve().parents[1]


def _pins(name: str) -> dict[str, str]:
    lines = (ROOT / "constraints" / name).read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def test_the_sdk_exports_its_public_names():
    missing = [name for name in breeze_client.__all__ if not hasattr(breeze_client, name)]
    assert missing == []
    for name in ("BreezeClient", "AsyncBreezeClient", "BreezeClientError", "SynthesisRequest", "FetchResult"):
        assert name in breeze_client.__all__
    # every error class the SDK raises is importable from the top level
    from breeze_client import errors

    raised = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.BreezeClientError)}
    assert raised - set(breeze_client.__all__) == set()


def test_the_version_comes_from_the_package_metadata():
    import breeze_worker

    installed = importlib.metadata.version("breeze-tts-serving")
    assert breeze_client.__version__ == installed == breeze_worker.__version__
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared and declared.group(1) == installed


def test_the_wheel_carries_the_typing_markers_and_the_stubs(tmp_path):
    source = tmp_path / "source"  # a copy: setuptools writes build/ and *.egg-info beside what it builds
    for name in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for name in ("protos", "worker", "client"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(source)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("breeze_tts_serving-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for marker in ("breeze_client/py.typed", "breeze_worker/py.typed", "breeze_tts_proto/py.typed",
                   "breeze_tts_proto/v1/synthesis_pb2.pyi", "breeze_tts_proto/v1/artifacts_pb2.pyi"):
        assert marker in names, marker


def test_one_set_of_pins_for_torch_and_triton():
    cpu, cuda = _pins("cpu.txt"), _pins("cuda.txt")
    assert set(cpu) == set(cuda) == {"torch", "triton"}
    pyproject = (ROOT / "pyproject.toml").read_text()
    # the project itself never pins them (the constraints do), so no second version can drift
    assert not re.search(r'"(torch|triton)\s*==', pyproject)
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert "constraints/cpu.txt" in install and "2.13" not in install
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "scripts/install.sh" in (ROOT / "scripts" / "test.sh").read_text()
    dockerfile = (ROOT / "ops" / "container" / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs and all("-c /src/constraints/cuda.txt" in line for line in installs)


def test_the_installed_cpu_versions_are_the_pinned_ones():
    import torch

    pins = _pins("cpu.txt")
    assert torch.__version__.split("+")[0] == pins["torch"]
    assert importlib.metadata.version("triton") == pins["triton"]


def test_the_gpu_figures_ran_with_the_pinned_cuda_versions():
    """The current GPU figures (docs/perf-data/*-20261203.json and *-20261204.json; a CPU run's file says it
    had no GPU) state the versions they ran with, and those are the versions the container installs."""
    pins = _pins("cuda.txt")
    folder = ROOT / "docs" / "perf-data"
    current = [path for path in sorted([*folder.glob("*-20261203.json"), *folder.glob("*-20261204.json")])
               if json.loads(path.read_text()).get("meta", {}).get("gpu", "unstated") is not None]
    assert len(current) >= 3
    for path in current:
        text = json.dumps(json.loads(path.read_text()))
        torch_versions = set(re.findall(r'"torch": "([^"]+)"', text))
        assert torch_versions, f"{path.name} does not say which torch it ran with"
        assert {v.split("+")[0] for v in torch_versions} == {pins["torch"]}, path.name
        for triton in re.findall(r'"triton": "([^"]+)"', text):
            assert triton == pins["triton"], path.name
