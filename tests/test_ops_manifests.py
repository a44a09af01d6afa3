"""The ops manifests agree with the worker's shutdown order: what they pass is accepted by `serve`'s own
parser, the stop timeout covers --grace-s + --artifact-grace-s, and artifacts sit on a volume that
outlives the container (not the pod-scoped emptyDir that lost them on every rollout).

The Kubernetes manifests are also checked against the Kubernetes API's own JSON schemas (strict: an unknown
field fails), bundled offline by the `kubernetes-validate` package, and against the worker: the probes watch
the health service names the worker reports, the autoscaler's metrics are gauges the worker exports."""

from __future__ import annotations

import argparse
import copy
import json
import re
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from breeze_worker.commands.serve import add_arguments, settings_from_args
from breeze_worker.engine.metrics import EngineMetrics

OPS = Path(__file__).resolve().parents[1] / "ops"
STOP_MARGIN_S = 10  # the engine's stop and the exit after the artifact grace
# what the required env file / Secret provides: a non-loopback worker refuses to start without a token
TOKEN_ENV = {"BREEZE_SERVER_AUTH_TOKEN": "from-the-env-file-or-secret"}
# the oldest Kubernetes the manifests support (the preStop sleep action is on by default from 1.30) and the
# newest whose schema the package bundles
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())


def _settings(argv: list[str], environ: dict[str, str]):
    """The server settings `serve` makes of these flags (the checkpoint directory, absent here, left out)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    i = argv.index("--model")
    return settings_from_args(parser.parse_args(argv[:i] + argv[i + 2:]), environ).server


def _k8s_documents() -> list[dict]:
    return [doc for path in sorted((OPS / "k8s").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if doc]


def _k8s(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in _k8s_documents() if d["kind"] == kind}


def _statefulset() -> tuple[dict, dict, dict]:
    sts = _k8s("StatefulSet")["breeze-worker"]
    pod = sts["spec"]["template"]
    return sts, pod, pod["spec"]["containers"][0]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_kubernetes_manifest_is_valid_against_the_kubernetes_schema(version):
    kinds = set()
    for doc in _k8s_documents():
        # raises ValidationError (a wrong field, type or missing requirement) or SchemaNotFoundError (a kind
        # without a schema, which would otherwise go unchecked)
        kubernetes_validate.validate(doc, version, strict=True)
        kinds.add(doc["kind"])
    assert kinds == {"StatefulSet", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap", "Job",
                     "PersistentVolumeClaim"}


def _set(path: str, value):
    def change(doc: dict) -> None:
        *parents, last = path.split(".")
        for key in parents:
            doc = doc[int(key)] if isinstance(doc, list) else doc[key]
        if value is _DELETE:
            del doc[last]
        else:
            doc[last] = value
    return change


_DELETE = object()
_PROBE = "spec.template.spec.containers.0"


@pytest.mark.parametrize("kind,change", [
    ("HorizontalPodAutoscaler", _set("spec.minReplica", 2)),  # a misspelt field
    ("HorizontalPodAutoscaler", _set("spec.maxReplicas", "8")),  # a string where the API wants an integer
    ("HorizontalPodAutoscaler", _set("spec.scaleTargetRef", _DELETE)),  # a required field missing
    ("HorizontalPodAutoscaler", _set("spec.metrics.0.pods.target.averageValue", [1])),  # not a quantity
    ("PodDisruptionBudget", _set("spec.maxUnavailble", 1)),
    ("StatefulSet", _set(f"{_PROBE}.readinessProbe.httpGet.port", 9464.5)),  # a port is a number or a name
    ("StatefulSet", _set(f"{_PROBE}.lifecycle.preStop.sleep", {"second": 5})),
    ("Service", _set("spec.clusterIp", "None")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_schema_check_rejects_a_broken_manifest(kind, change):
    doc = copy.deepcopy(next(d for d in _k8s_documents() if d["kind"] == kind))
    kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)  # the real one passes
    change(doc)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)


def test_kubernetes_statefulset_drains_in_order_and_keeps_artifacts():
    sts, pod, container = _statefulset()
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    server = _settings(["--model", "/models/breeze", *container["args"]], env)
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    # terminationGracePeriodSeconds counts from the start of preStop, then SIGTERM starts the drain
    assert pod["spec"]["terminationGracePeriodSeconds"] >= (pre_stop + server.grace_s + server.artifact_grace_s
                                                            + STOP_MARGIN_S)
    assert server.artifact_grace_s > 0 and server.max_connection_age_s > 0
    mounted = {m["name"] for m in container["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    assert "artifacts" in mounted and "artifacts" in claims  # a PVC per pod, kept across restarts
    assert "artifacts" not in {v["name"] for v in pod["spec"].get("volumes", [])}
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain"
    assert "replicas" not in sts["spec"]  # the autoscaler owns it
    governing = _k8s("Service")[sts["spec"]["serviceName"]]
    assert governing["spec"]["publishNotReadyAddresses"] is True  # a draining pod's name still resolves
    assert f".{sts['spec']['serviceName']}." in container["args"][1]  # the address advertised is that name


def test_kubernetes_probes_ask_the_worker_s_probe_routes_on_its_metrics_port():
    """The kubelet's gRPC probes cannot speak TLS, which the worker serves: the probes are plain HTTP on the metrics
    port the worker listens on (the image's --metrics-port), at the routes metrics_http.py serves."""
    _, _, container = _statefulset()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    image = _image_argv()
    assert ports["metrics"] == int(image[image.index("--metrics-port") + 1])
    for probe in ("startupProbe", "readinessProbe"):  # 503 while warming up and from a drain's start
        assert container[probe]["httpGet"] == {"port": "metrics", "path": "/healthz"}
    # 200 until the artifact grace ends: a draining worker is not restarted (the routes' answers:
    # tests/transport/test_metrics_http.py)
    assert container["livenessProbe"]["httpGet"] == {"port": "metrics", "path": "/livez"}


def test_kubernetes_statefulset_passes_its_token_with_tls():
    _, pod, container = _statefulset()
    env = {e["name"]: e for e in container["env"]}
    assert env["BREEZE_SERVER_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "breeze-worker"
    cert, key = env["BREEZE_SERVER_TLS_CERT"]["value"], env["BREEZE_SERVER_TLS_KEY"]["value"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert cert == f"{mounts['tls']}/tls.crt" and key == f"{mounts['tls']}/tls.key"
    assert volumes["tls"]["secret"]["secretName"] == "breeze-worker-tls"
    values = {name: e["value"] for name, e in env.items() if "value" in e}
    server = _settings(["--model", "/models/breeze", *container["args"]], {**values, **TOKEN_ENV})
    assert server.auth_token and server.tls_cert is not None and server.tls_key is not None


def test_every_kubernetes_manifest_states_the_oldest_kubernetes_it_supports():
    for path in sorted((OPS / "k8s").glob("*.yaml")):
        assert f"Needs Kubernetes {K8S_VERSIONS[0]} or later" in path.read_text(), path.name


def test_kubernetes_services_give_a_fleet_address_a_simple_address_and_per_pod_names():
    _, pod, container = _statefulset()
    labels = pod["metadata"]["labels"]
    services = _k8s("Service")
    fleet, simple = services["breeze-worker"], services["breeze-worker-lb"]
    assert fleet["spec"]["clusterIP"] == "None" and not fleet["spec"].get("publishNotReadyAddresses")
    assert simple["spec"]["type"] == "ClusterIP" and "clusterIP" not in simple["spec"]
    named_ports = {p["name"] for p in container["ports"]}
    for service in services.values():
        assert service["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named_ports
    for service in (fleet, simple):
        assert {"synth"} <= {p["targetPort"] for p in service["spec"]["ports"]}
    budget = _k8s("PodDisruptionBudget")["breeze-worker"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["maxUnavailable"] == 1


def test_kubernetes_autoscaler_scales_the_statefulset_on_gauges_the_worker_exports():
    sts, _, _ = _statefulset()
    hpa = _k8s("HorizontalPodAutoscaler")["breeze-worker"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (sts["kind"], sts["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2  # one can be disrupted while another serves
    exported = {m.name: m.type for m in EngineMetrics().registry.collect()}
    adapter = yaml.safe_load(_k8s("ConfigMap")["breeze-worker-prometheus-adapter"]["data"]["config.yaml"])
    served = {rule["name"]["as"]: rule for rule in adapter["rules"]}
    metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert set(metrics) == {"breeze_queued_requests", "breeze_active_streams"}
    for name in metrics:
        assert exported.get(name) == "gauge", f"the worker exports no gauge {name}"
        rule = served[name]  # the adapter serves it per pod, from the series of that name
        assert re.match(rf"^{name}\{{", rule["seriesQuery"]) and re.fullmatch(rule["name"]["matches"], name)
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_systemd_unit():
    unit = (OPS / "systemd" / "breeze-worker.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit, re.S | re.M).group(1).replace("\\\n", " ")
    argv = shlex.split(exec_start)
    assert re.search(r"^EnvironmentFile=/", unit, re.M)  # required (no "-"): it holds the token
    server = _settings(argv[argv.index("serve") + 1:], TOKEN_ENV)
    timeout = float(re.search(r"^TimeoutStopSec=(\d+)", unit, re.M).group(1))
    assert timeout >= server.grace_s + server.artifact_grace_s + STOP_MARGIN_S
    assert "/var/lib/breeze" in re.search(r"^ReadWritePaths=(.*)$", unit, re.M).group(1)


def _image_argv() -> list[str]:
    """The container's ENTRYPOINT."""
    dockerfile = (OPS / "container" / "Dockerfile").read_text()
    return json.loads(re.search(r"^ENTRYPOINT (\[.*?\])$", dockerfile, re.S | re.M).group(1).replace("\\\n", " "))


def test_container_image():
    dockerfile = (OPS / "container" / "Dockerfile").read_text()
    argv = _image_argv()
    assert "--env-file" in dockerfile  # the documented run passes the token's env file
    server = _settings(argv[argv.index("serve") + 1:], TOKEN_ENV)
    timeout = float(re.search(r"--stop-timeout (\d+)", dockerfile).group(1))
    assert timeout >= server.grace_s + server.artifact_grace_s + STOP_MARGIN_S
    assert 'VOLUME ["/var/lib/breeze/artifacts"]' in dockerfile


def test_the_compile_bundle_job_builds_what_the_workers_install():
    """The Job compiles with the StatefulSet's image, GPU kind and engine settings (what the bundle's key holds),
    into the volume the workers mount, at the path they are told; `compile` accepts its command line."""
    from breeze_worker.commands.compile_bundle import add_arguments as compile_arguments

    _, pod, container = _statefulset()
    job = _k8s("Job")["breeze-compile-bundle"]["spec"]["template"]["spec"]
    compile_container = job["containers"][0]
    assert compile_container["image"] == container["image"] and job["nodeSelector"] == pod["spec"]["nodeSelector"]
    worker_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    job_env = {e["name"]: e["value"] for e in compile_container["env"]}
    shaping = {k: v for k, v in worker_env.items() if k.startswith("BREEZE_ENGINE_")}
    assert shaping.pop("BREEZE_ENGINE_COMPILE_BUNDLE") and shaping == job_env
    command = compile_container["command"]
    assert command[:2] == ["breeze-worker", "compile"]
    parser = argparse.ArgumentParser()
    compile_arguments(parser)
    args = parser.parse_args(command[2:])
    assert str(args.out) == worker_env["BREEZE_ENGINE_COMPILE_BUNDLE"]

    def claim(spec: dict, mounted_at: str) -> str:
        volumes = {v["name"]: v for v in spec["volumes"]}
        mount = next(m for c in spec["containers"] for m in c["volumeMounts"] if m["mountPath"] == mounted_at)
        return volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]

    directory = str(args.out.parent)
    assert claim(job, directory) == claim(pod["spec"], directory) == "breeze-compile-bundles"
