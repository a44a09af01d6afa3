"""`breeze-client fetch ARTIFACT_ID -o FILE`: download over the artifact channel, print the retrieval timestamps.

Times are milliseconds after the request was sent, on this machine's clock; (w) marks worker events,
mapped through the clock exchange and uncertain by the +- shown.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from breeze_client import jsonout
from breeze_client.channel import ConnectionOptions
from breeze_client.commands._local import writable_file
from breeze_client.commands._output import print_rows
from breeze_client.errors import BreezeClientError
from breeze_client.sdk import BreezeClient


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact_id", help="the artifact id printed by synth (art-...)")
    p.add_argument("-o", "--output", type=Path, required=True, help="file to write")
    p.add_argument("--resume", action="store_true", help="continue a partial download already in --output")
    p.add_argument("--offset", type=int, default=0, help="first byte to fetch")
    p.add_argument("--limit", type=int, default=0, help="most bytes to fetch (0 = to the end)")
    p.add_argument("--chunk-size", type=int, default=0, help="bytes per message (0 = the worker's default)")
    p.add_argument("--compression", choices=("none", "zstd"), default="none")
    p.add_argument("--no-verify", action="store_true", help="skip the SHA-256 check")


def run(args: argparse.Namespace, options: ConnectionOptions) -> int:
    writable_file("-o", args.output)
    offset = args.offset
    if args.resume and args.output.exists():
        offset = os.path.getsize(args.output)
    with BreezeClient(options=options) as client:
        try:
            result = client.fetch(args.artifact_id, args.output, offset=offset, limit=args.limit,
                                  chunk_size=args.chunk_size, compression=args.compression,
                                  verify=not args.no_verify)
        except (BreezeClientError, KeyboardInterrupt) as exc:
            kept = args.output.stat().st_size if args.output.is_file() else 0
            if kept > offset:  # what arrived is kept where it belongs: the next fetch continues after it
                exc.add_note(f"{args.output}: the first {kept} bytes of the artifact are kept; continue with "
                             f"breeze-client fetch {args.artifact_id} -o {args.output} --resume")
            raise
    jsonout.write(result.to_dict(), args.json)
    t = result.timing
    t0 = t.request_sent_ns
    pm = f"(w, +-{t.clock_uncertainty_ns / 1e6:.3f} ms)"

    def at(ns):
        return "-" if ns is None else f"{(ns - t0) / 1e6:10.3f} ms"

    rate = f"{result.mb_per_s:.1f} MB/s" if result.mb_per_s else "-"
    check = "sha256 verified" if result.verified else "sha256 not checked (partial range)"
    print_rows([
        ("artifact", f"{result.artifact_id}  {result.size_bytes} bytes at {result.endpoint}  ({check})"),
        ("request sent", at(t.request_sent_ns)),
        (f"request received {pm}", at(t.server_request_received_ns)),
        (f"file opened {pm}", at(t.server_file_opened_ns)),
        (f"first byte sent {pm}", at(t.server_first_byte_sent_ns)),
        ("first byte received", at(t.first_byte_received_ns)),
        (f"last byte sent {pm}", at(t.server_last_byte_sent_ns)),
        ("last byte received", at(t.last_byte_received_ns)),
        ("file fsynced", at(t.file_fsynced_ns)),
        ("transfer", f"{result.bytes_received} bytes ({result.wire_bytes} on the wire, {result.compression}) in "
                     f"{result.chunks} chunks, {rate}, {result.resumes} resumes"),
        ("wrote", str(args.output)),
    ])
    return 0
