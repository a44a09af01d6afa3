"""The artifact store: atomic commit, byte-exact WAV, id checks before file-system access, retention."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from breeze_worker.artifacts.dirlock import LOCK_NAME
from breeze_worker.artifacts.store import ARTIFACT_ID_PATTERN, ArtifactStore
from breeze_worker.config import ArtifactSettings
from breeze_worker.engine.types import PcmEncoding
from breeze_worker.errors import InvalidRequest, NotFound


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(ArtifactSettings(directory=tmp_path / "artifacts"))


def _pcm(encoding: PcmEncoding, n: int = 1000, seed: int = 0) -> bytes:
    x = np.random.default_rng(seed).uniform(-0.9, 0.9, n).astype(np.float32)
    return (x * 32767).astype("<i2").tobytes() if encoding is PcmEncoding.S16LE else x.astype("<f4").tobytes()


@pytest.mark.parametrize("encoding", list(PcmEncoding))
def test_committed_wav_holds_the_streamed_pcm_byte_for_byte(store, encoding):
    pcm = _pcm(encoding)
    writer = store.begin("job-1", 24000, encoding)
    for i in range(0, len(pcm), 333 * encoding.sample_width):
        writer.append(pcm[i:i + 333 * encoding.sample_width])
    info = writer.commit()
    path = store.wav_path(info.artifact_id)
    raw = path.read_bytes()
    assert raw.endswith(pcm) and len(raw) == info.size_bytes
    assert hashlib.sha256(raw).hexdigest() == info.sha256
    data, rate = sf.read(path, dtype="int16" if encoding is PcmEncoding.S16LE else "float32")
    assert rate == 24000 and data.tobytes() == pcm
    assert sf.info(str(path)).subtype == ("PCM_16" if encoding is PcmEncoding.S16LE else "FLOAT")
    described = lambda i: (i.artifact_id, i.size_bytes, i.sha256)  # noqa: E731 - commit times differ (see below)
    assert described(store.stat(info.artifact_id)) == described(info)
    f, opened = store.open_for_read(info.artifact_id)
    with f:
        assert f.read() == raw and described(opened) == described(info)


def test_ids_are_unguessable_and_nothing_half_written_is_visible(store):
    writers = [store.begin(f"job-{i}", 24000, PcmEncoding.S16LE) for i in range(20)]
    ids = {w.artifact_id for w in writers}
    assert len(ids) == 20 and all(ARTIFACT_ID_PATTERN.fullmatch(i) for i in ids)
    w = writers[0]
    w.append(b"\x01\x00" * 10)
    with pytest.raises(NotFound):
        store.stat(w.artifact_id)  # still writing: not served
    for x in writers:
        x.abort()
    assert os.listdir(store.directory) == [LOCK_NAME]  # abort removed every temporary file
    with pytest.raises(RuntimeError):
        w.append(b"\0\0")


def test_writer_context_aborts_on_error(store):
    with pytest.raises(ValueError):
        with store.begin("job-1", 24000, PcmEncoding.S16LE) as w:
            w.append(b"\0\0")
            raise ValueError("engine failed")
    assert os.listdir(store.directory) == [LOCK_NAME]
    with pytest.raises(NotFound):
        store.stat(w.artifact_id)


@pytest.mark.parametrize("bad", ["../etc/passwd", "art-../../x", "/etc/passwd", "art-" + "0" * 31,
                                 "art-" + "A" * 32, "art-" + "0" * 32 + "/", "", "art-" + "0" * 32 + "\0"])
def test_malformed_ids_are_rejected_before_any_file_system_access(store, bad, monkeypatch):
    def no_fs(*args, **kwargs):
        raise AssertionError("the file system was touched for a malformed id")

    monkeypatch.setattr("builtins.open", no_fs)
    monkeypatch.setattr(os, "unlink", no_fs)
    for call in (store.stat, store.open_for_read, store.delete):
        with pytest.raises(InvalidRequest, match="malformed"):
            call(bad)


def test_unknown_id_is_not_found_and_delete_removes_both_files(store):
    with pytest.raises(NotFound, match="does not exist"):
        store.stat("art-" + "0" * 32)
    w = store.begin("job-1", 24000, PcmEncoding.S16LE)
    w.append(b"\0\0" * 4)
    info = w.commit()
    store.delete(info.artifact_id)
    assert os.listdir(store.directory) == [LOCK_NAME]
    with pytest.raises(NotFound):
        store.delete(info.artifact_id)


def test_retention_by_age_and_total_size(tmp_path):
    store = ArtifactStore(ArtifactSettings(directory=tmp_path, max_age_s=3600, max_total_bytes=10_000))
    infos = []
    for i in range(4):
        w = store.begin(f"job-{i}", 24000, PcmEncoding.S16LE)
        w.append(b"\0" * 4000)
        infos.append(w.commit())
    # the oldest artifact is made two hours old: deleted by age; then the total (3 x 4044) exceeds 10 000
    old = store.sidecar_path(infos[0].artifact_id)
    record = json.loads(old.read_text())
    record["committed_at_ns"] = time.time_ns() - int(7200e9)
    old.write_text(json.dumps(record))
    deleted = store.enforce_retention()
    assert deleted == [infos[0].artifact_id, infos[1].artifact_id]
    assert store.list_ids() == sorted(i.artifact_id for i in infos[2:])
    assert store.enforce_retention() == []


def test_stale_partial_files_are_removed_by_retention(tmp_path):
    store = ArtifactStore(ArtifactSettings(directory=tmp_path, max_age_s=60))
    w = store.begin("job-crashed", 24000, PcmEncoding.S16LE)
    w.append(b"\0\0")
    partial = next(tmp_path.glob(".art-*.partial"))
    past = time.time() - 120
    os.utime(partial, (past, past))
    store.enforce_retention()
    assert not partial.exists()


def test_fault_commit_delay_delays_the_commit(tmp_path):
    settings = ArtifactSettings(directory=tmp_path)
    store = ArtifactStore(replace(settings, fault_commit_delay_s=0.2))
    w = store.begin("job-1", 24000, PcmEncoding.S16LE)
    w.append(b"\0\0")
    t0 = time.time_ns()
    info = w.commit()
    assert info.committed_at_ns - t0 >= 0.2e9


def test_the_commit_times_its_steps_and_the_sidecar_keeps_them(store):
    writer = store.begin("job-1", 24000, PcmEncoding.S16LE)
    writer.append(_pcm(PcmEncoding.S16LE, 48000))
    info = writer.commit()
    c = info.commit
    sidecar = store.sidecar_path(info.artifact_id).stat().st_size
    # what the syncs still wrote: the sidecar, and the WAV's part not yet on the volume (early write-back)
    assert c is not None and sidecar + 44 < c.bytes_synced <= info.size_bytes + sidecar
    assert min(c.wav_fsync_ns, c.hash_ns, c.rename_ns, c.sidecar_fsync_ns, c.dir_fsync_ns) > 0
    steps = c.wav_fsync_ns + c.hash_ns + c.rename_ns + c.sidecar_fsync_ns + c.dir_fsync_ns
    assert info.committed_at_ns - c.started_at_ns >= steps  # the commit time is after the last fsync
    stat = store.stat(info.artifact_id)  # the sidecar is stamped before its own write: it cannot time it
    assert stat.committed_at_ns <= info.committed_at_ns
    assert stat.commit == replace(c, bytes_synced=info.size_bytes, sidecar_fsync_ns=0, dir_fsync_ns=0)


def test_the_storage_fault_slows_the_fsync_and_is_timed_there(tmp_path):
    store = ArtifactStore(ArtifactSettings(directory=tmp_path, fault_storage_write_bytes_per_s=200_000))
    writer = store.begin("job-1", 24000, PcmEncoding.S16LE)
    writer.append(b"\0" * 40_000)  # + the 44-byte header: >= 0.2 s at 200 kB/s
    c = writer.commit().commit
    assert c.wav_fsync_ns >= 0.2e9 and c.hash_ns < 0.1e9
