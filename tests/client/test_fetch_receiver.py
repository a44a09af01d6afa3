"""FetchReceiver: ordered writes, zstd, integrity checks, timing, resume into a partial file."""

from __future__ import annotations

import hashlib

import pytest
import zstandard

from breeze_client._receive import FetchReceiver
from breeze_client.clock import ClockMapping
from breeze_client.errors import IntegrityError
from breeze_tts_proto.v1 import artifacts_pb2, common_pb2

FILE = bytes(range(256)) * 40  # 10 240 bytes
CLOCK = ClockMapping(offset_ns=1_000_000, uncertainty_ns=10, rtt_ns=20, samples=3)


def _messages(data: bytes, offset: int, chunk: int, zstd: bool):
    info = common_pb2.ArtifactInfo(artifact_id="art-" + "1" * 32, size_bytes=len(data),
                                   sha256=hashlib.sha256(data).hexdigest())
    out, pos, first = [], offset, True
    while first or pos < len(data):
        raw = data[pos:pos + chunk]
        m = artifacts_pb2.FetchArtifactResponse(
            data=zstandard.ZstdCompressor().compress(raw) if zstd else raw, offset=pos, uncompressed_size=len(raw))
        if first:
            m.info.CopyFrom(info)
            m.request_received_unix_ns = 2_000_000
            m.file_opened_unix_ns, m.first_byte_sent_unix_ns = 2_100_000, 2_200_000
            first = False
        out.append(m)
        pos += len(raw)
    out.append(artifacts_pb2.FetchArtifactResponse(offset=pos, last=True, last_byte_sent_unix_ns=2_900_000))
    return out


@pytest.mark.parametrize("zstd", [False, True])
@pytest.mark.parametrize("chunk", [1, 1000, 4096, 20000])
def test_whole_file_in_memory(zstd, chunk):
    r = FetchReceiver("art-" + "1" * 32, None, 0, 0, chunk, "zstd" if zstd else "none", CLOCK, "host:1")
    r.next_request()
    for i, m in enumerate(_messages(FILE, 0, chunk, zstd)):
        r.on_message(m, 10_000_000 + i)
    result = r.finish()
    assert result.data == FILE and result.verified and result.bytes_received == len(FILE)
    assert result.chunks == -(-len(FILE) // chunk)
    t = result.timing
    assert t.server_request_received_ns == 1_000_000 and t.server_last_byte_sent_ns == 1_900_000  # mapped
    assert t.first_byte_received_ns == 10_000_000 and t.request_sent_ns <= t.file_fsynced_ns
    assert t.clock_uncertainty_ns == 10
    if not zstd:
        assert result.wire_bytes == len(FILE)
    elif chunk >= 1000:  # repetitive data compresses; 1-byte frames only grow
        assert result.wire_bytes < len(FILE)


def test_resume_into_a_partial_file_verifies_the_whole_file(tmp_path):
    path = tmp_path / "out.wav"
    path.write_bytes(FILE[:3000])
    r = FetchReceiver("art-" + "1" * 32, path, 3000, 0, 1024, "none", CLOCK, "host:1")
    assert r.next_request().offset == 3000
    for m in _messages(FILE, 3000, 1024, False):
        r.on_message(m, 1)
    result = r.finish()
    assert path.read_bytes() == FILE and result.verified and result.bytes_received == len(FILE) - 3000


def test_a_gap_or_a_wrong_size_is_an_integrity_error():
    r = FetchReceiver("art-" + "1" * 32, None, 0, 0, 1000, "none", CLOCK, "host:1")
    msgs = _messages(FILE, 0, 1000, False)
    r.on_message(msgs[0], 1)
    with pytest.raises(IntegrityError, match="offset 2000"):
        r.on_message(msgs[2], 2)
    bad = artifacts_pb2.FetchArtifactResponse(data=b"xx", offset=1000, uncompressed_size=5)
    with pytest.raises(IntegrityError, match="2 bytes"):
        r.on_message(bad, 3)


def test_a_wrong_hash_is_an_integrity_error():
    r = FetchReceiver("art-" + "1" * 32, None, 0, 0, 4096, "none", CLOCK, "host:1")
    msgs = _messages(FILE, 0, 4096, False)
    msgs[1].data = b"\0" * len(msgs[1].data)
    for m in msgs:
        r.on_message(m, 1)
    with pytest.raises(IntegrityError, match="SHA-256"):
        r.finish()


def test_after_a_break_the_next_request_continues_where_the_bytes_stopped():
    r = FetchReceiver("art-" + "1" * 32, None, 0, 5000, 1000, "none", CLOCK, "host:1")
    r.next_request()
    for m in _messages(FILE, 0, 1000, False)[:2]:
        r.on_message(m, 1)
    r.resumed()
    again = r.next_request()
    assert (again.offset, again.limit, r.resumes) == (2000, 3000, 0)  # not yet: nothing came back
    r.resumed()  # that attempt failed at once; the next one brings the stream back
    r.on_message(_messages(FILE, 2000, 1000, False)[0], 2)
    assert (r.position, r.resumes) == (3000, 1)
