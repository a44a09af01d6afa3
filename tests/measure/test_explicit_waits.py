"""measure/instruments.py `explicit_waits`: the waits CUDA's sync debug mode does not report (the fast path's
per-frame read waits on an event) are counted while the block is open, and the originals come back after."""

from __future__ import annotations

import torch

from breeze_worker.measure.instruments import explicit_waits


def test_explicit_waits_are_counted_and_restored(monkeypatch):
    calls = []
    # stand-ins for the CUDA calls (this machine has no GPU); explicit_waits wraps whatever is installed
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("device"))
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: calls.append("event"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: calls.append("stream"))
    installed = torch.cuda.Event.synchronize
    with explicit_waits() as waits:
        assert torch.cuda.Event.synchronize is not installed
        torch.cuda.synchronize()
        torch.cuda.Event.synchronize(object())
        torch.cuda.Stream.synchronize(object())
        torch.cuda.Event.synchronize(object())
    assert waits["n"] == 4 and calls == ["device", "event", "stream", "event"]  # counted and still called
    assert torch.cuda.Event.synchronize is installed
    torch.cuda.synchronize()
    assert waits["n"] == 4 and len(calls) == 5  # nothing counted after the block
