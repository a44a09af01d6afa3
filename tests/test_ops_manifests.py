"""The ops manifests agree with the worker's shutdown order: what they pass is accepted by `serve`'s own
parser, the stop timeout covers --grace-s + --artifact-grace-s, and artifacts sit on a volume that
outlives the container (not the pod-scoped emptyDir that lost them on every rollout)."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import yaml

from breeze_worker.commands.serve import add_arguments, settings_from_args

OPS = Path(__file__).resolve().parents[1] / "ops"
STOP_MARGIN_S = 10  # the engine's stop and the exit after the artifact grace
# what the required env file / Secret provides: a non-loopback worker refuses to start without a token
TOKEN_ENV = {"BREEZE_SERVER_AUTH_TOKEN": "from-the-env-file"}


def _settings(argv: list[str], environ: dict[str, str]):
    """The server settings `serve` makes of these flags (the checkpoint directory, absent here, left out)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    i = argv.index("--model")
    return settings_from_args(parser.parse_args(argv[:i] + argv[i + 2:]), environ).server


def test_kubernetes_statefulset():
    docs = {d["kind"]: d for d in yaml.safe_load_all((OPS / "k8s" / "statefulset.yaml").read_text())}
    sts = docs["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    server = _settings(["--model", "/models/breeze", *container["args"]], env)
    assert pod["terminationGracePeriodSeconds"] >= server.grace_s + server.artifact_grace_s + STOP_MARGIN_S
    assert server.artifact_grace_s > 0
    mounted = {m["name"] for m in container["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    assert "artifacts" in mounted and "artifacts" in claims  # a PVC per pod, kept across restarts
    assert "artifacts" not in {v["name"] for v in pod.get("volumes", [])}
    services = {d["metadata"]["name"]: d for d in yaml.safe_load_all((OPS / "k8s" / "service.yaml").read_text())}
    governing = services[sts["spec"]["serviceName"]]
    assert governing["spec"]["publishNotReadyAddresses"] is True  # a draining pod's name still resolves
    assert f".{sts['spec']['serviceName']}." in container["args"][1]  # the address advertised is that name


def test_systemd_unit():
    unit = (OPS / "systemd" / "breeze-worker.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit, re.S | re.M).group(1).replace("\\\n", " ")
    argv = shlex.split(exec_start)
    assert re.search(r"^EnvironmentFile=/", unit, re.M)  # required (no "-"): it holds the token
    server = _settings(argv[argv.index("serve") + 1:], TOKEN_ENV)
    timeout = float(re.search(r"^TimeoutStopSec=(\d+)", unit, re.M).group(1))
    assert timeout >= server.grace_s + server.artifact_grace_s + STOP_MARGIN_S
    assert "/var/lib/breeze" in re.search(r"^ReadWritePaths=(.*)$", unit, re.M).group(1)


def test_container_image():
    dockerfile = (OPS / "container" / "Dockerfile").read_text()
    entry = re.search(r"^ENTRYPOINT (\[.*?\])$", dockerfile, re.S | re.M).group(1).replace("\\\n", " ")
    argv = json.loads(entry)
    assert "--env-file" in dockerfile  # the documented run passes the token's env file
    server = _settings(argv[argv.index("serve") + 1:], TOKEN_ENV)
    timeout = float(re.search(r"--stop-timeout (\d+)", dockerfile).group(1))
    assert timeout >= server.grace_s + server.artifact_grace_s + STOP_MARGIN_S
    assert 'VOLUME ["/var/lib/breeze/artifacts"]' in dockerfile
