"""The artifact channel against the real worker: ranges, chunk sizes, zstd, resume after a drop, errors."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
from tcp_proxy import TcpProxy
from worker_helpers import assert_still_serving

from breeze_client.aio import AsyncBreezeClient
from breeze_client.errors import InvalidArgument, NotFound, OutOfRange, Unavailable


@pytest.fixture(scope="module")
def artifact(worker):
    from breeze_client.sdk import BreezeClient

    with BreezeClient(worker.target, timeout_s=120) as c:
        result = c.synthesize("A file to fetch in pieces.", max_frames=24, seed=21)
        whole = c.fetch(result.artifact)
    assert whole.verified and hashlib.sha256(whole.data).hexdigest() == result.artifact.sha256
    return result.artifact, whole.data


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("chunk_size", [0, 1000, 16384, 1 << 20])
def test_whole_fetch_with_each_chunk_size_and_compression(client, artifact, tmp_path, compression, chunk_size):
    ref, data = artifact
    out = tmp_path / "a.wav"
    r = client.fetch(ref, out, chunk_size=chunk_size, compression=compression)
    assert out.read_bytes() == data and r.verified and r.bytes_received == len(data) and r.resumes == 0
    expected_chunks = -(-len(data) // (chunk_size or 256 * 1024))
    assert r.chunks == expected_chunks
    t = r.timing
    assert t.request_sent_ns < t.first_byte_received_ns <= t.last_byte_received_ns <= t.file_fsynced_ns
    u = t.clock_uncertainty_ns
    assert t.server_request_received_ns <= t.server_file_opened_ns <= t.server_first_byte_sent_ns
    assert t.request_sent_ns - u <= t.server_request_received_ns <= t.first_byte_received_ns + u
    assert t.server_last_byte_sent_ns <= t.file_fsynced_ns + u


@pytest.mark.parametrize("offset,limit", [(100, 0), (0, 5000), (777, 1234), ("last", 0), ("size", 0)])
def test_ranges(client, artifact, offset, limit):
    ref, data = artifact
    offset = {"last": len(data) - 1, "size": len(data)}.get(offset, offset)
    r = client.fetch(ref, None, offset=offset, limit=limit, chunk_size=1000)
    end = len(data) if limit == 0 else offset + limit
    assert r.data == data[offset:end] and r.bytes_received == end - offset and not r.verified


def test_resume_from_a_partial_file(client, artifact, tmp_path):
    ref, data = artifact
    out = tmp_path / "partial.wav"
    out.write_bytes(data[:12345])
    r = client.fetch(ref, out, offset=12345)
    assert out.read_bytes() == data and r.verified and r.bytes_received == len(data) - 12345


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_resume_after_the_connection_drops_mid_stream(client, worker, artifact, tmp_path, compression):
    ref, data = artifact
    assert len(data) > 60_000
    with TcpProxy(worker.artifact_target, drop_after_bytes=30_000) as proxy:
        out = tmp_path / "dropped.wav"
        r = client.fetch(ref, out, chunk_size=4096, compression=compression, endpoint=proxy.address)
        assert proxy.dropped == 1 and proxy.connections >= 2
    assert r.resumes == 1 and r.verified and out.read_bytes() == data
    assert r.bytes_received == len(data)


def test_resume_waits_out_an_outage_of_seconds(client, worker, artifact, tmp_path):
    """The stream breaks, then the endpoint refuses connections for 3 s: the fetch resumes once it is back, in
    one resume however busy the machine is. The proxy resets the connection, and a reset discards what the
    client's kernel had not yet handed to gRPC: on a loaded machine that can be everything, even the stream's
    first message (the fetch resumes anyway: its channel was connected), and the channel can still look
    connected when the break is seen (the attempt made on it fails at once and is not a resume)."""
    ref, data = artifact
    with TcpProxy(worker.artifact_target, drop_after_bytes=30_000, outage_s=3.0) as proxy:
        out = tmp_path / "outage.wav"
        t0 = time.monotonic()
        r = client.fetch(ref, out, chunk_size=4096, endpoint=proxy.address)
        elapsed = time.monotonic() - t0
        assert proxy.dropped == 1 and proxy.outages == 1
    assert elapsed >= 3.0  # it really waited for the endpoint to come back
    assert r.resumes == 1 and r.verified and out.read_bytes() == data


async def test_async_resume_waits_out_an_outage(worker, artifact, tmp_path):
    ref, data = artifact
    with TcpProxy(worker.artifact_target, drop_after_bytes=30_000, outage_s=2.0) as proxy:
        async with AsyncBreezeClient(worker.target, timeout_s=120) as aclient:
            r = await aclient.fetch(ref, tmp_path / "outage.wav", chunk_size=4096, compression="zstd",
                                    endpoint=proxy.address)
        assert proxy.dropped == 1 and proxy.outages == 1
    assert r.resumes == 1 and r.verified and (tmp_path / "outage.wav").read_bytes() == data


def test_an_outage_longer_than_resume_timeout_gives_up_and_keeps_the_bytes(client, worker, artifact, tmp_path):
    ref, data = artifact
    out = tmp_path / "gave-up.wav"
    # the proxy holds the transfer after 30 000 bytes and is cut once the client has written some of them (a
    # cut at a byte count could come before a busy client read its first message: it would keep nothing)
    with TcpProxy(worker.artifact_target, stall_after_bytes=30_000, outage_s=600.0) as proxy:
        failed: list[BaseException] = []
        ended_at: list[float] = []

        def fetch():
            try:
                client.fetch(ref, out, chunk_size=4096, endpoint=proxy.address, resume_timeout_s=1.5)
            except BaseException as exc:  # noqa: BLE001 - the verdict is below
                failed.append(exc)
            ended_at.append(time.monotonic())

        thread = threading.Thread(target=fetch)
        thread.start()
        deadline = time.monotonic() + 300  # a hang guard only
        while not (out.exists() and out.stat().st_size > 0) and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out.exists() and out.stat().st_size > 0, failed
        t0 = time.monotonic()
        proxy.cut()
        thread.join(300)
        assert len(failed) == 1 and isinstance(failed[0], Unavailable), failed
        assert "resume_timeout_s" in failed[0].message
        assert ended_at[0] - t0 >= 1.5  # it waited its resume_timeout_s ...
        assert proxy.dropped == 1 and proxy.outages == 0  # ... and gave up before the endpoint came back
    info = failed[0]
    kept = out.stat().st_size
    assert 0 < kept < len(data) and out.read_bytes() == data[:kept]
    assert f"offset {kept}" in info.message  # says where to continue
    r = client.fetch(ref, out, offset=kept)  # ... and continuing from there completes the file
    assert r.verified and out.read_bytes() == data


def test_stat_and_delete(client):
    result = client.synthesize("Delete me.", max_frames=2, seed=8)
    ref = result.artifact
    stat = client.stat(ref.artifact_id)
    assert (stat.size_bytes, stat.sha256, stat.endpoint) == (ref.size_bytes, ref.sha256, ref.endpoint)
    assert client.delete(ref.artifact_id) == ref.size_bytes
    with pytest.raises(NotFound, match="does not exist"):
        client.stat(ref.artifact_id)


@pytest.mark.parametrize("artifact_id,error,words", [
    ("art-" + "0" * 32, NotFound, "does not exist"),
    ("../../etc/passwd", InvalidArgument, "malformed"),
    ("art-0000/../../x", InvalidArgument, "malformed"),
    ("/etc/passwd", InvalidArgument, "malformed"),
])
def test_bad_artifact_ids(client, artifact_id, error, words):
    for call in (client.stat, lambda i: client.fetch(i), client.delete):
        with pytest.raises(error, match=words) as info:
            call(artifact_id)
        assert "art-" in info.value.message  # says what a good id looks like
    assert_still_serving(client)


def test_offset_past_the_end_is_out_of_range(client, artifact):
    ref, data = artifact
    with pytest.raises(OutOfRange, match=f"between 0 and {len(data)}"):
        client.fetch(ref, None, offset=len(data) + 1)
    with pytest.raises(InvalidArgument, match="chunk_size"):
        client.fetch(ref, None, chunk_size=64 * 1024 * 1024)
    assert_still_serving(client)
