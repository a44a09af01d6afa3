"""One configuration surface: the environment is read in breeze_worker/config.py only, and what ops/ sets (the
variables of the Kubernetes manifest and the unit, the flags of the container, the unit and the StatefulSet)
is what the worker's settings declare."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from pathlib import Path

import yaml

from breeze_worker.commands.serve import add_arguments
from breeze_worker.config import WorkerSettings, setting_fields

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "worker" / "breeze_worker"
# the functions that touch the process environment for someone else's switch, never for a setting of ours
NOT_OURS = {
    ("engine/fastpath/fused.py", "interpreting"),  # TRITON_INTERPRET: Triton's own interpreter switch
    ("doctor/sandbox.py", "private_caches"),  # points the compilers' caches at a temporary directory, then restores
}
_ENV = ("environ", "environb", "getenv", "putenv", "unsetenv")


def _environment_reads(path: Path) -> list[tuple[int, str]]:
    """(line, enclosing function or "") of each use of os.environ / os.getenv / ... in `path`."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Attribute) and node.attr in _ENV and isinstance(node.value, ast.Name) \
                and node.value.id == "os":
            found.append((node.lineno, function))
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name in _ENV for a in node.names):
            found.append((node.lineno, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def test_only_config_reads_the_environment():
    reads = {str(p.relative_to(PACKAGE)): _environment_reads(p) for p in PACKAGE.rglob("*.py")}
    assert reads.pop("config.py"), "config.py reads the environment (WorkerSettings.load)"
    elsewhere = {(name, function) for name, found in reads.items() for _, function in found}
    assert elsewhere == NOT_OURS, f"the environment touched outside config.py: {elsewhere - NOT_OURS}"


def test_the_scan_finds_an_environment_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom os import getenv\n\n\ndef f():\n    return os.environ.get('BREEZE_X')\n")
    assert _environment_reads(module) == [(2, ""), (6, "f")]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_the_variables_ops_sets_are_settings():
    known = {f.env for f in setting_fields(WorkerSettings)}
    manifest = list(yaml.safe_load_all((ROOT / "ops/k8s/statefulset.yaml").read_text()))
    env_names = [e["name"] for doc in manifest if doc and doc.get("kind") == "StatefulSet"
                 for c in doc["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
    assert env_names and [n for n in env_names if n.startswith("BREEZE_") and n not in known] == []
    for path in ("ops/systemd/breeze-worker.service", "ops/container/Dockerfile", "ops/k8s/statefulset.yaml"):
        # whole names only (BREEZE_SERVER_TLS_* names a family)
        named = set(re.findall(r"\bBREEZE_(?:ENGINE|SERVER|ARTIFACTS|FASTPATH|FUSED)_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])",
                               (ROOT / path).read_text()))
        assert named - known == set(), path


def test_the_flags_ops_passes_parse_as_settings():
    unit = (ROOT / "ops/systemd/breeze-worker.service").read_text()
    exec_start = unit.split("ExecStart=", 1)[1].split("\n#", 1)[0].replace("\\\n", " ")
    argv = shlex.split(exec_start)
    dockerfile = (ROOT / "ops/container/Dockerfile").read_text()
    entry = dockerfile.split("ENTRYPOINT ", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ").strip()
    manifest = list(yaml.safe_load_all((ROOT / "ops/k8s/statefulset.yaml").read_text()))
    args = [a for doc in manifest if doc and doc.get("kind") == "StatefulSet"
            for c in doc["spec"]["template"]["spec"]["containers"] for a in c.get("args", [])]
    for command in (argv[argv.index("serve") + 1:], __import__("json").loads(entry)[2:], args):
        assert command
        parsed = _parser().parse_args(command)  # an unknown flag exits with status 2
        assert any(getattr(parsed, f.dest) is not None for f in setting_fields(WorkerSettings))
