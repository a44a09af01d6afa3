"""Host-sync detection (measure/syncaudit.py) and `breeze-worker audit-syncs`: the JSON schema, the known
per-frame counts of both decode paths on the CPU (emulated device), and a deliberately added sync caught
with a non-zero exit and its source line named."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from breeze_worker.cli import main as worker_main
from breeze_worker.engine import eager
from breeze_worker.measure.syncaudit import SyncDetector

RUN_KEYS = {"path", "frames", "emulated_device", "setup_syncs", "syncs_per_frame", "max_syncs_per_frame",
            "mean_syncs_per_frame", "after_last_frame", "budget", "frames_over_budget", "within_budget", "sites",
            "cuda_sync_debug_per_frame", "events"}
EVENT_KEYS = {"op", "site", "function", "code", "origin", "setup", "frame"}


@pytest.fixture
def use_tiny(monkeypatch, tiny_for_runs):
    monkeypatch.setattr("breeze_worker.measure.setup.load_model",
                        lambda args, device, precision=None: tiny_for_runs)
    return tiny_for_runs


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
        flags = torch.zeros(2, 8, dtype=torch.bool, device=cpu)
        flags[:, 0] = True  # a fill: free
        flags[0, torch.ones(1, dtype=torch.int64, device=cpu)] = True  # the scalar is uploaded: 1
        flags[1, 2] = True  # one element: 1
        flags[[0, 1], 3] = True  # the list index is uploaded, then the scalar: 2
    ops = [e.op for e in d.events]
    assert ops == ["cpu", "item", "h2d", "h2d", "nonzero", "mask_index", "multinomial", "h2d", "h2d", "h2d",
                   "h2d"], ops
    assert all(e.site == "<outside breeze_worker>" and e.origin.endswith(".py:" + e.origin.split(":")[-1])
               for e in d.events)


def test_audit_json_schema_and_known_counts(tmp_path, use_tiny):
    code, doc = _audit(tmp_path, "--path", "both")
    assert code == 0
    assert doc["schema"] == "breeze-audit-syncs/1" and doc["within_budget"] is True
    meta_keys = {"device", "device_type", "torch", "date", "model", "precision", "frames", "cfg", "budget"}
    assert meta_keys <= set(doc["meta"])
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
    # (FrameRunner.read_frame, once per frame)
    assert {(s["site"].split(":")[0], s["op"]) for s in fast_sites} == {
        ("breeze_worker/engine/fastpath/graph.py", "cpu")} and sum(s["count"] for s in fast_sites) == 3
    # the eager reference (as torch.cuda's sync debug mode counts it on an H200): frame index upload,
    # codebook-0 read, 14 depth positions uploaded, codes copied out, and from frame 1 on the codebook-0
    # history update `seen[0, code0] = True` (a Python scalar written through a tensor index)
    assert runs["eager"]["syncs_per_frame"] == [17, 18, 18]
    eager_ops = sorted((s["op"], s["count"]) for s in runs["eager"]["sites"] if not s["setup"])
    assert eager_ops == [("cpu", 3), ("h2d", 2), ("h2d", 3), ("h2d", 42), ("item", 3)]


def test_the_budget_judges_the_fast_path_and_reports_the_eager_one(tmp_path, use_tiny, capsys):
    """The README's `audit-syncs --path both --budget 1`: the fast path is within it, the eager reference
    (18 syncs a frame by design) is reported without a verdict, and the run exits 0."""
    code, doc = _audit(tmp_path, "--path", "both", "--budget", "1")
    runs = {r["path"]: r for r in doc["paths"]}
    assert code == 0 and doc["within_budget"] is True and doc["meta"]["budget_applies_to"] == "fast"
    assert runs["fast"]["budget"] == 1 and runs["fast"]["within_budget"] is True
    assert runs["eager"]["budget"] is None and runs["eager"]["max_syncs_per_frame"] == 18
    assert runs["eager"]["frames_over_budget"] == []
    table = capsys.readouterr().out
    assert "[fast] 3 frames" in table and "budget 1: ok" in table
    assert "reported only: the budget is the fast path's" in table


def test_a_deliberately_added_sync_is_caught_and_named(tmp_path, use_tiny, monkeypatch):
    code, before = _audit(tmp_path, "--path", "eager", "--budget", "0")
    assert code == 0 and before["paths"][0]["max_syncs_per_frame"] == 18  # the eager path is never judged

    original = eager.sample_rows

    def sample_rows_with_a_read(logits, *args, **kwargs):
        logits.max().item()  # the deliberate host sync
        return original(logits, *args, **kwargs)

    monkeypatch.setattr(eager, "sample_rows", sample_rows_with_a_read)
    code, after = _audit(tmp_path, "--path", "eager")
    run = after["paths"][0]
    assert code == 0 and run["syncs_per_frame"] == [17 + 16, 18 + 16, 18 + 16]
    # named: the lines in eager.py that call the sampler, for codebook 0 and for the depth steps
    source = inspect.getsource(eager).splitlines()
    call_lines = {number for number, line in enumerate(source, start=1) if "= sample_rows(" in line}
    new = [s for s in run["sites"] if s["op"] == "item" and "code0.item()" not in s["code"]]
    assert {int(s["site"].rsplit(":", 1)[1]) for s in new} == call_lines
    assert all(s["site"].startswith("breeze_worker/engine/eager.py:") and "sample_rows(" in s["code"] for s in new)
    assert sorted(s["per_frame"] for s in new) == [1.0, 15.0]
    assert all(s["origin"].startswith(__file__) or __file__.endswith(s["origin"].rsplit(":", 1)[0]) for s in new)


def test_explicit_waits_and_bool_comparisons_are_counted(monkeypatch):
    """torch.cuda.synchronize (mocked: no CUDA here), Stream/Event.synchronize, torch.equal, torch.allclose."""
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    # no stream or event can be made without CUDA: their methods are mocked and called on a stand-in
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: waited.append("stream"))
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: waited.append("event"))
    stream_sync, event_sync = torch.cuda.Stream.synchronize, torch.cuda.Event.synchronize
    cpu = torch.device("cpu")
    with SyncDetector(cpu) as d:
        torch.cuda.synchronize(cpu)
        torch.cuda.Stream.synchronize(object())
        torch.cuda.Event.synchronize(object())
        dev, host = torch.ones(3, device=cpu), torch.ones(3)
        assert torch.equal(dev, dev.clone()) and dev.allclose(dev) and torch.allclose(dev, dev)
        assert torch.equal(host, host)  # two host tensors: free
    assert [e.op for e in d.events] == ["synchronize", "stream_synchronize", "event_synchronize", "equal",
                                        "allclose", "allclose"]
    assert waited == [cpu, "stream", "event"]  # the wrapped functions still ran
    # restored on exit: nothing is recorded afterwards, the originals are back
    assert torch.cuda.Stream.synchronize is stream_sync and torch.cuda.Event.synchronize is event_sync
    torch.cuda.synchronize()
    assert len(d.events) == 6 and waited == [cpu, "stream", "event", None]


def test_a_deliberately_added_cuda_synchronize_in_the_fast_path_is_caught(tmp_path, use_tiny, monkeypatch):
    from breeze_worker.engine.fastpath import step

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # stands in for a device wait
    original = step.sample_rows

    def sample_rows_then_wait(*args, **kwargs):
        codes = original(*args, **kwargs)
        torch.cuda.synchronize()  # the deliberate sync, once per codebook
        return codes

    monkeypatch.setattr(step, "sample_rows", sample_rows_then_wait)
    code, doc = _audit(tmp_path, "--path", "fast", "--budget", "1")
    run = doc["paths"][0]
    assert code == 1 and doc["within_budget"] is False
    assert run["syncs_per_frame"] == [1 + 16] * 3 and run["frames_over_budget"] == [0, 1, 2]
    waits = [s for s in run["sites"] if s["op"] == "synchronize" and not s["setup"]]
    assert len(waits) == 1 and waits[0]["per_frame"] == 16.0
    assert waits[0]["site"].startswith("breeze_worker/engine/fastpath/step.py:") and "sample_rows(" in waits[0]["code"]


def test_json_to_stdout_is_only_the_document(use_tiny, capsys):
    """`--json -`: stdout parses as the one JSON document; the table goes to stderr (the convention of both
    command-line tools)."""
    assert worker_main(["audit-syncs", "--device", "cpu", "--frames", "2", "--path", "fast", "--json", "-"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["schema"] == "breeze-audit-syncs/1" and "[fast] 2 frames" in out.err
