"""`breeze-client health`: grpc.health.v1 on both ports plus the worker's own description.

Exits 0 when the worker serves synthesis and artifacts, 1 otherwise (NOT_SERVING while the model loads).
"""

from __future__ import annotations

import argparse

from breeze_client import jsonout
from breeze_client.channel import ConnectionOptions
from breeze_client.commands._output import print_rows
from breeze_client.sdk import BreezeClient

SYNTHESIS = "breeze.tts.v1.Synthesis"
ARTIFACTS = "breeze.tts.v1.Artifacts"


def add_arguments(p: argparse.ArgumentParser) -> None:
    del p  # connection flags only


def run(args: argparse.Namespace, options: ConnectionOptions) -> int:
    with BreezeClient(options=options) as client:
        synthesis = client.health(SYNTHESIS)
        info = client.worker_info()
        artifact_target = client.artifact_target()
        artifacts = client.health(ARTIFACTS, target=artifact_target)
        clock = client.sync_clock()
    ok = synthesis == "SERVING" and artifacts == "SERVING"
    jsonout.write({"ok": ok, "synthesis": {"target": options.target, "status": synthesis},
                "artifacts": {"target": artifact_target, "status": artifacts},
                "worker": info.to_dict(), "clock": clock.to_dict()}, args.json)
    rows = [
        ("synthesis", f"{synthesis}  at {options.target}"),
        ("artifacts", f"{artifacts}  at {artifact_target}"),
        ("model", f"{info.model_description}  ({info.sample_rate} Hz, worker {info.version})"),
        ("clock", f"worker - client = {clock.offset_ns / 1e6:+.3f} ms +- {clock.uncertainty_ns / 1e6:.3f} ms"),
    ]
    if info.max_active_streams:
        rows.append(("streams", f"{info.ready_streams} of {info.max_active_streams} ready"
                                + (f"  (building {info.startup_building})" if info.startup_building else "")))
    if info.artifact_store_degraded:
        rows.append(("DEGRADED", f"artifact store: {info.artifact_store_degraded} (jobs stream audio without an "
                                 "artifact)"))
    if info.warning:
        rows.append(("WARNING", info.warning))
    print_rows(rows)
    return 0 if ok else 1
