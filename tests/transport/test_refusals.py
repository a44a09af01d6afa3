"""The per-address budget of failed authentications and the aggregate refusal log (transport/refusals.py), on a
clock the test moves."""

from __future__ import annotations

import logging

from breeze_worker.transport import refusals
from breeze_worker.transport.refusals import FailureBudget, RefusalLog, peer_address


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_peer_addresses_drop_the_port():
    assert peer_address("ipv4:10.0.0.7:51234") == "10.0.0.7"
    assert peer_address("ipv6:[::1]:51234") == "::1"
    assert peer_address("ipv6:[2001:db8::5]:443") == "2001:db8::5"
    assert peer_address("unix:/run/breeze.sock") == "unix:/run/breeze.sock"


def test_a_peer_fails_its_burst_then_regains_one_failure_per_period():
    clock = Clock()
    budget = FailureBudget(burst=3, per_s=10.0, clock=clock)
    for _ in range(3):
        assert not budget.exhausted("a")
        budget.fail("a")
    assert budget.exhausted("a") and not budget.exhausted("b")
    assert budget.retry_after_s("a") == 10.0
    clock.now += 9.9
    assert budget.exhausted("a")
    clock.now += 0.1
    assert not budget.exhausted("a")
    budget.fail("a")
    assert budget.exhausted("a")


def test_the_budget_forgets_recovered_peers_and_never_holds_more_than_its_bound(monkeypatch):
    monkeypatch.setattr(refusals, "MAX_PEERS", 100)
    clock = Clock()
    budget = FailureBudget(burst=2, per_s=1.0, clock=clock)
    for n in range(100):
        budget.fail(f"10.0.0.{n}")
    clock.now += 5  # every one of them is back at a full budget
    budget.fail("10.0.1.1")
    assert len(budget) == 1
    for n in range(500):  # a spray of addresses, each failing once
        budget.fail(f"10.1.{n // 250}.{n % 250}")
        assert len(budget) <= 100
    budget.fail("10.9.9.9")
    budget.fail("10.9.9.9")
    assert budget.exhausted("10.9.9.9")  # the newest and emptiest are kept


def test_refusals_are_one_line_per_kind_per_interval(caplog):
    clock = Clock()
    log = RefusalLog(logging.getLogger("refusals-test"), interval_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="refusals-test"):
        for n in range(1000):
            log.note("calls refused without a valid token", f"10.0.0.{n % 3}", "wrong bearer token")
        log.note("health watchers refused", "10.0.0.9", "the bound")
        assert len(caplog.records) == 2  # the first of each kind
        clock.now += 60
        log.note("calls refused without a valid token", "10.0.0.1", "wrong bearer token")
    assert len(caplog.records) == 3
    summary = caplog.records[-1].getMessage()
    assert summary.startswith("calls refused without a valid token: 1000 in the last 60 s, from 3 peer(s) (most: ")
    assert "10.0.0.1 x334" in summary
