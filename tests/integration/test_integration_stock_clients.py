"""Fetch with the documented largest chunk (4 MiB) through clients with stock settings: a grpcio channel without
options, the Python SDK held to the same 4 MiB receive limit, and a stock grpc-js client in Node.js (installed
from the npm registry by `npm ci` into tests/interop/node/node_modules, which git ignores). Every message must
fit in gRPC's default 4 MiB receive limit.

The artifact is a 9 MB WAV of random PCM (incompressible, so zstd cannot shrink a chunk either), written by the
worker's own ArtifactStore; generating that much audio with the tiny model would take minutes on a CPU."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import grpc
import pytest
from host_tools import need_tools

from breeze_client.sdk import BreezeClient
from breeze_tts_proto.v1 import artifacts_pb2, artifacts_pb2_grpc
from breeze_worker.engine.types import PcmEncoding
from breeze_worker.transport.artifact_servicer import MAX_CHUNK_BYTES, MAX_DATA_BYTES

NODE_DIR = Path(__file__).resolve().parents[1] / "interop" / "node"
STOCK_RECEIVE_LIMIT = 4 * 1024 * 1024  # grpcio's and grpc-js's default max receive message length


@pytest.fixture(scope="module")
def big_artifact(worker):
    writer = worker.store.begin("job-stock-clients", 24000, PcmEncoding.F32LE)
    writer.append(os.urandom(9_000_000))
    info = writer.commit()
    data = worker.store.wav_path(info.artifact_id).read_bytes()
    assert hashlib.sha256(data).hexdigest() == info.sha256
    return info


@pytest.fixture(scope="session")
def node_fetch() -> Path:
    need_tools("node", "npm")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js" / "package.json").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=NODE_DIR, check=True,
                       capture_output=True, timeout=300)
    return NODE_DIR / "fetch_artifact.js"


@pytest.mark.parametrize("compression", [artifacts_pb2.COMPRESSION_NONE, artifacts_pb2.COMPRESSION_ZSTD])
def test_a_stock_grpcio_channel_fetches_with_the_largest_chunk(worker, big_artifact, compression):
    import zstandard

    request = artifacts_pb2.FetchArtifactRequest(artifact_id=big_artifact.artifact_id, chunk_size=MAX_CHUNK_BYTES,
                                                 compression=compression)
    digest, sizes, data_sizes = hashlib.sha256(), [], []
    with grpc.insecure_channel(worker.artifact_target) as channel:  # no options: stock limits
        for msg in artifacts_pb2_grpc.ArtifactsStub(channel).Fetch(request, timeout=120):
            sizes.append(msg.ByteSize())
            if msg.data:
                data = (zstandard.ZstdDecompressor().decompress(msg.data, max_output_size=msg.uncompressed_size)
                        if compression == artifacts_pb2.COMPRESSION_ZSTD else msg.data)
                assert len(data) == msg.uncompressed_size
                digest.update(data)
                data_sizes.append(len(data))
    assert digest.hexdigest() == big_artifact.sha256
    assert max(sizes) <= STOCK_RECEIVE_LIMIT
    assert max(data_sizes) == MAX_DATA_BYTES and len(data_sizes) == 3  # 9 MB in messages of 4 MiB - 64 KiB
    print(f"largest Fetch message {max(sizes):,} bytes (limit {STOCK_RECEIVE_LIMIT:,})")


def test_the_sdk_fetches_with_the_largest_chunk_under_the_stock_receive_limit(worker, big_artifact, tmp_path):
    with BreezeClient(worker.target, timeout_s=120, max_message_bytes=STOCK_RECEIVE_LIMIT) as client:
        for compression in ("none", "zstd"):
            fetched = client.fetch(big_artifact.artifact_id, tmp_path / f"big-{compression}.wav",
                                   chunk_size=MAX_CHUNK_BYTES, compression=compression)
            assert fetched.verified and fetched.size_bytes == big_artifact.size_bytes


def test_a_stock_grpc_js_client_fetches_with_the_largest_chunk(worker, big_artifact, node_fetch):
    proc = subprocess.run(["node", str(node_fetch), "--target", worker.artifact_target, "--artifact",
                           big_artifact.artifact_id, "--chunk-size", str(MAX_CHUNK_BYTES)],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"], report
    assert report["bytes"] == big_artifact.size_bytes and report["sha256"] == big_artifact.sha256
    assert report["max_message_bytes"] <= STOCK_RECEIVE_LIMIT
    assert report["messages"] == 5  # header, 3 data messages, last
