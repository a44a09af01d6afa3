"""Retrieval diagnosis of what the client does: applications with their own timing, and a stepped client clock.

Each fault lives outside the code that measures it, in a client process of its own:
- applications built on the SDK (`netpath.client_app`): one that polls for finished jobs on a fixed schedule,
  one that waits a fixed time before it fetches, one that opens a fresh client per download (over a path
  with a round trip, where setting a connection up costs something); their retrievals are diagnosed from the
  SDK's records, as an application would;
- a client whose wall clock steps forward or back in the middle of a fetch (the fake-clock shim,
  `netpath.fakeclock`, on `netpath.client_proc`).
Each is diagnosed with one run and with several: the cause is the same, or one run says what only several
can tell (`needs_runs`) and several settle it.
"""

from __future__ import annotations

import math

import pytest
from netpath.client_app import run_app
from netpath.client_proc import ClientProcess
from netpath.fakeclock import SHIM_DIR, FakeClock
from netpath.proxy import DelayProxy, ProxyThread
from test_retrieval_diagnosis import worker  # noqa: F401 (the fixture)

PERIOD_S = 3.0  # the polling application's schedule: long beside a job's time and how much that varies
DELAY_S = 0.4  # the delaying application's wait


def app(target: str, artifact_target: str, mode: str, jobs: int, *args: str) -> dict:
    return run_app("--target", target, "--artifact-target", artifact_target, "--mode", mode, "--jobs", str(jobs),
                   "--period", str(PERIOD_S), "--delay", str(DELAY_S), *args)


def gaps(out: dict) -> list[float]:
    return [run["phases"]["client_gap"]["duration_s"] for run in out["runs"]]


def show(out: dict) -> None:
    """What the diagnosis said (with -s): runs, cause, phase, the gaps, the headline evidence."""
    v = out["diagnosis"]["verdict"]
    print(f"-n {len(out['runs'])}: {v['cause']} in {v['phase']}; gaps {[round(g, 3) for g in gaps(out)]}; "
          + " | ".join(v["evidence"][1:]) + (f" | to tell apart: {v['needs_runs']}" if v["needs_runs"] else ""))


def test_a_client_that_polls_is_named_polling_once_several_runs_show_it(worker):  # noqa: F811
    three, one = (app(worker.target, worker.artifact_target, "poll", n) for n in (3, 1))
    show(three)
    show(one)
    seen = gaps(three)
    # the fault as injected: each job waited for the next poll, at a different point of the schedule
    assert all(0 <= g <= PERIOD_S + 0.1 for g in seen) and max(seen) - min(seen) >= PERIOD_S / 4, seen
    v = three["diagnosis"]["verdict"]
    assert v["phase"] == "client_gap" and v["cause"] == "polling", (v["evidence"], v["details"])
    assert v["needs_runs"] is None and any("varied" in e for e in v["evidence"] + v["details"])
    assert "polling" in v["fix"] and "final message" in v["fix"]
    # one gap cannot show a schedule: the application's delay is named, and what several runs would tell apart
    v1 = one["diagnosis"]["verdict"]
    assert v1["phase"] == "client_gap" and v1["cause"] == "client_delay", v1["evidence"]
    assert "polling" in v1["needs_runs"] and "-n 3" in v1["needs_runs"]


def test_a_client_that_waits_a_fixed_time_is_named_with_one_run_or_three(worker):  # noqa: F811
    for n in (1, 3):
        out = app(worker.target, worker.artifact_target, "delay", n)
        show(out)
        assert all(DELAY_S <= g <= DELAY_S + 0.15 for g in gaps(out)), gaps(out)
        v = out["diagnosis"]["verdict"]
        assert v["phase"] == "client_gap" and v["cause"] == "client_delay", v["evidence"]
        assert "drop the sleep" in v["fix"]
        if n > 1:  # settled: the same gap every run
            assert v["needs_runs"] is None and any("constant offset" in e for e in v["evidence"] + v["details"])


def test_a_fresh_client_per_download_is_a_cold_start_with_one_run_or_three(worker):  # noqa: F811
    host, synthesis_port = worker.target.rsplit(":", 1)
    _, artifact_port = worker.artifact_target.rsplit(":", 1)
    # 30 ms each way: a fresh connection's set-up and its clock exchange cost a few round trips
    with ProxyThread([DelayProxy((host, int(synthesis_port)), delay_s=0.03),
                      DelayProxy((host, int(artifact_port)), delay_s=0.03)]) as proxies:
        synthesis, artifacts = (p.address for p in proxies.proxies)
        for n in (1, 3):
            out = app(synthesis, artifacts, "cold", n)
            show(out)
            v = out["diagnosis"]["verdict"]
            assert v["phase"] == "client_gap" and v["cause"] == "cold_start", v["evidence"]
            assert any("opened its artifact channel" in e for e in v["evidence"]), v["evidence"]
            assert all(g >= 4 * 0.06 for g in gaps(out)), gaps(out)  # set-up and clock exchange: round trips
            assert "keep one client" in v["fix"]


@pytest.mark.parametrize(("step_s", "jobs"), [(5.0, 1), (-3.0, 1), (5.0, 3)])
def test_a_step_of_the_client_clock_is_named_for_the_client_and_moves_no_phase(worker, step_s, jobs):  # noqa: F811
    """A wall-clock step in the middle of a fetch was once added to the transfer (3.95 s printed as 8.95 s), or
    blamed on the worker's clock. The client times its phases on its monotonic clock. The step comes at the
    first fetch's first write: with three runs, the other two see none, and the cause is the same."""
    chunk, write_s = 8192, 0.02
    with FakeClock() as clock, ClientProcess("--target", worker.target, "--artifact-target", worker.artifact_target,
                                             "--jobs", str(jobs), "--max-frames", "40", "--chunk-size", str(chunk),
                                             "--write-delay", str(write_s), "--step-clock", str(step_s),
                                             env=clock.env(), python_path=[SHIM_DIR]) as child:
        out = child.go()
    runs = out["runs"]
    assert len(runs) == jobs
    for i, run in enumerate(runs):
        assert run["clock"]["status"] == "ok", run["clock"]  # the worker's clock did not move
        stepped = run["clock"]["client_evidence"]
        if i > 0:  # the clock stepped once, in the first run
            assert stepped == [], stepped
        else:
            (line,) = stepped
            assert f"{step_s:+.2f} s" in line and "client's clock, not the worker's" in line, line
            print(f"step {step_s:+.2f} s: {line}")
        writes = math.ceil(run["file_bytes"] / chunk)
        phases = run["phases"]
        fetched = phases["transfer"]["span_s"] + phases["client_write"]["span_s"]  # first byte -> on disk
        print(f"-n {jobs} run {i + 1}: first byte -> on disk {fetched:.3f} s for {writes} writes of {write_s} s")
        assert writes * write_s <= fetched <= writes * write_s + 1.0, (fetched, writes)  # not the step's seconds
    v = out["diagnosis"]["verdict"]
    assert v["cause"] == "slow_client_disk" and v["severity"] == "fault", v["evidence"]
    assert v["runs_by_cause"] == {"slow_client_disk": jobs}, v["runs_by_cause"]
    assert "this client's wall clock stepped (run 1;" in out["text"] and "the worker's clock" not in out["text"]
