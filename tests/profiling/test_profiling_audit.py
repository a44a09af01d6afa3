"""Host-sync detection (engine/syncaudit.py) and `breeze-worker audit-syncs`: the JSON schema, the known
per-frame counts of both decode paths on the CPU (emulated device), and a deliberately added sync caught
with a non-zero exit and its source line named."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from breeze_worker.cli import main as worker_main
from breeze_worker.engine import eager
from breeze_worker.engine.syncaudit import SyncDetector

RUN_KEYS = {"path", "frames", "emulated_device", "setup_syncs", "syncs_per_frame", "max_syncs_per_frame",
            "mean_syncs_per_frame", "after_last_frame", "budget", "frames_over_budget", "within_budget", "sites",
            "cuda_sync_debug_per_frame", "events"}
EVENT_KEYS = {"op", "site", "function", "code", "origin", "setup", "frame"}


@pytest.fixture
def use_tiny(monkeypatch, tiny_lm):
    monkeypatch.setattr("breeze_worker.profiling.setup.load_model", lambda args, device, precision=None: tiny_lm)
    return tiny_lm


def _audit(tmp_path, *flags: str) -> tuple[int, dict]:
    out = tmp_path / "audit.json"
    code = worker_main(["audit-syncs", "--device", "cpu", "--frames", "3", "--json", str(out), *flags])
    return code, json.loads(out.read_text())


def test_detector_on_the_cpu_counts_what_would_sync_on_a_device():
    cpu = torch.device("cpu")  # the emulated device (the literal "cpu" means the host)
    with SyncDetector(cpu) as d:
        x = torch.arange(6.0)  # a factory without device=: a host tensor
        dev = torch.zeros(4, device=cpu)
        host = dev.cpu()
        assert host is not dev  # the host copy is made real
        bool(host[0])  # a host read: free
        float(x.sum())  # host data: free
        dev.sum().item()  # 1 read
        torch.tensor([1, 2], device=cpu)  # 1 pageable host-to-device copy
        x.to(cpu)  # 1 more
        torch.nonzero(dev)  # 1 data-dependent shape
        dev[dev > 0]  # 1 boolean-mask index
        torch.multinomial(torch.ones(3, device=cpu), 1)  # 1
    ops = [e.op for e in d.events]
    assert ops == ["cpu", "item", "h2d", "h2d", "nonzero", "mask_index", "multinomial"], ops
    assert all(e.site == "<outside breeze_worker>" and e.origin.endswith(".py:" + e.origin.split(":")[-1])
               for e in d.events)


def test_audit_json_schema_and_known_counts(tmp_path, use_tiny):
    code, doc = _audit(tmp_path, "--path", "both")
    assert code == 0
    assert doc["schema"] == "breeze-audit-syncs/1" and doc["within_budget"] is True
    assert {"device", "device_type", "torch", "date", "model", "precision", "frames", "cfg", "budget"} <= set(doc["meta"])
    runs = {r["path"]: r for r in doc["paths"]}
    assert set(runs) == {"eager", "fast"}
    for r in runs.values():
        assert set(r) == RUN_KEYS and r["frames"] == 3 and r["emulated_device"] is True
        assert r["setup_syncs"] > 0 and r["cuda_sync_debug_per_frame"] is None
        assert all(set(e) == EVENT_KEYS for e in r["events"])
        assert all({"site", "op", "setup", "function", "code", "origin", "count", "per_frame"} <= set(s)
                   for s in r["sites"])
    # the fast path's design: one host read per frame (the packed readout)
    assert runs["fast"]["syncs_per_frame"] == [1, 1, 1]
    fast_sites = [s for s in runs["fast"]["sites"] if not s["setup"]]
    assert [(s["site"].split(":")[0], s["op"]) for s in fast_sites] == [("breeze_worker/engine/fastpath/graph.py", "cpu")]
    # the eager reference: frame index upload, codebook-0 read, 14 depth positions uploaded, codes copied out
    assert runs["eager"]["syncs_per_frame"] == [17, 17, 17]
    eager_ops = sorted((s["op"], s["per_frame"]) for s in runs["eager"]["sites"] if not s["setup"])
    assert eager_ops == [("cpu", 1.0), ("h2d", 1.0), ("h2d", 14.0), ("item", 1.0)]


def test_a_deliberately_added_sync_is_caught_and_named(tmp_path, use_tiny, monkeypatch):
    code, before = _audit(tmp_path, "--path", "eager", "--budget", "17")
    assert code == 0 and before["paths"][0]["max_syncs_per_frame"] == 17

    original = eager.sample_rows

    def sample_rows_with_a_read(logits, *args, **kwargs):
        logits.max().item()  # the deliberate host sync
        return original(logits, *args, **kwargs)

    monkeypatch.setattr(eager, "sample_rows", sample_rows_with_a_read)
    code, after = _audit(tmp_path, "--path", "eager", "--budget", "17")
    run = after["paths"][0]
    assert code == 1 and after["within_budget"] is False
    assert run["syncs_per_frame"] == [17 + 16] * 3 and run["frames_over_budget"] == [0, 1, 2]
    # named: the lines in eager.py that call the sampler, for codebook 0 and for the depth steps
    source = inspect.getsource(eager).splitlines()
    call_lines = {number for number, line in enumerate(source, start=1) if "= sample_rows(" in line}
    new = [s for s in run["sites"] if s["op"] == "item" and "code0.item()" not in s["code"]]
    assert {int(s["site"].rsplit(":", 1)[1]) for s in new} == call_lines
    assert all(s["site"].startswith("breeze_worker/engine/eager.py:") and "sample_rows(" in s["code"] for s in new)
    assert sorted(s["per_frame"] for s in new) == [1.0, 15.0]
    assert all(s["origin"].startswith(__file__) or __file__.endswith(s["origin"].rsplit(":", 1)[0]) for s in new)
