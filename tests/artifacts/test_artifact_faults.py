"""Storage faults fail one artifact, never the writer's caller: a real full tmpfs (mounted here, root),
the test-only EIO setting, temp files removed even when close() fails, the start-up sweep, headroom
eviction and the degraded state."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

from breeze_worker.artifacts.dirlock import LOCK_NAME
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings
from breeze_worker.engine.types import PcmEncoding

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from disk import fill, small_tmpfs  # noqa: E402

pytestmark = pytest.mark.root
MIB = 1024 * 1024


def _store(directory: Path, **kw) -> ArtifactStore:
    kw.setdefault("min_free_bytes", 0)
    return ArtifactStore(ArtifactSettings(directory=directory, **kw))


def _files(directory: Path) -> list[str]:
    """The directory's files but the store's lock."""
    return sorted(p.name for p in directory.iterdir() if p.name != LOCK_NAME)


def test_a_full_disk_fails_that_artifact_only_and_removes_its_temp_file(tmp_path):
    with small_tmpfs(tmp_path / "disk", 2 * MIB) as disk:
        store = _store(disk)
        small = store.begin("job-small", 24000, PcmEncoding.S16LE)
        big = store.begin("job-big", 24000, PcmEncoding.F32LE)
        small.append(b"\1\0" * 4000)
        for _ in range(40):  # 40 x 64 KiB: more than the disk holds
            big.append(b"\0" * 65536)
            small.append(b"\2\0" * 100)  # the other writer keeps writing between the big one's writes
        assert big.unavailable_reason and "disk is full" in big.unavailable_reason
        assert "ENOSPC" in big.unavailable_reason
        assert big.commit() is None
        assert not (disk / f".{big.artifact_id}.partial").exists()  # removed at once, freeing its space
        info = small.commit()  # the other artifact is whole
        raw = store.wav_path(info.artifact_id).read_bytes()
        assert raw[44:] == b"\1\0" * 4000 + b"\2\0" * 4000 and hashlib.sha256(raw).hexdigest() == info.sha256
        assert _files(disk) == sorted([f"{info.artifact_id}.json", f"{info.artifact_id}.wav"])
        status = store.status()
        assert status.unavailable == {"no_space": 1}
        assert not status.degraded  # the commit after the failure showed the disk writable again


def test_abort_on_a_full_disk_discards_the_buffered_audio_and_removes_the_temp_file(tmp_path, caplog):
    with small_tmpfs(tmp_path / "disk", 1 * MIB) as disk:
        store = _store(disk)
        writer = store.begin("job-1", 24000, PcmEncoding.S16LE)
        writer.append(b"\0" * 4000)  # still in the writer's buffer
        fill(disk)  # the disk fills up behind it
        with caplog.at_level("DEBUG", logger="breeze_worker.artifacts.store"):
            writer.abort()  # the buffered audio is dropped, not written first: nothing fails
        assert "failed" not in caplog.text
        assert not list(disk.glob(".art-*.partial"))


class _CloseFails:
    """The writer's file, whose close fails after closing (as a network file system's may report EIO)."""

    def __init__(self, f) -> None:
        self._f = f
        self.closed = False

    def close(self) -> None:
        self._f.close()
        self.closed = True
        raise OSError(5, "Input/output error")


def test_abort_removes_the_temp_file_even_when_close_fails(tmp_path, caplog):
    store = _store(tmp_path)
    writer = store.begin("job-1", 24000, PcmEncoding.S16LE)
    writer.append(b"\0" * 4000)
    writer._file = _CloseFails(writer._file)
    with caplog.at_level("DEBUG", logger="breeze_worker.artifacts.store"):
        writer.abort()
    assert "closing its temp file failed" in caplog.text and "Input/output error" in caplog.text
    assert not list(tmp_path.glob(".art-*.partial"))


def test_a_commit_that_cannot_be_written_gives_the_artifact_up_cleanly(tmp_path):
    with small_tmpfs(tmp_path / "disk", 1 * MIB) as disk:
        store = _store(disk)
        writer = store.begin("job-1", 24000, PcmEncoding.S16LE)
        writer.append(b"\0" * 6000)  # buffered: the commit's flush is the first write to reach the disk
        hog = fill(disk)
        assert writer.commit() is None and "disk is full" in writer.unavailable_reason
        assert _files(disk) == [hog.name]  # no temp file, no WAV, no sidecar (or its temp) left
        assert store.status().degraded


def test_eio_while_writing_fails_that_artifact_only(tmp_path):
    """The test-only EIO setting (no real EIO source here: no device mapper; a loop device on a full backing
    file reports ENOSPC, not EIO)."""
    store = _store(tmp_path, fault_eio_after_bytes=10_000)
    failing = store.begin("job-1", 24000, PcmEncoding.S16LE)
    other = store.begin("job-2", 24000, PcmEncoding.S16LE)
    for _ in range(5):
        failing.append(b"\0" * 4000)
    other.append(b"\0" * 8000)
    assert "I/O error" in failing.unavailable_reason and "EIO" in failing.unavailable_reason
    assert failing.commit() is None and failing.data_bytes == 8000
    assert other.commit() is not None
    assert store.status().unavailable == {"io_error": 1}
    assert not list(tmp_path.glob(".art-*"))


def test_opening_the_store_sweeps_what_a_crashed_run_left(tmp_path):
    store = _store(tmp_path)
    kept = store.begin("job-kept", 24000, PcmEncoding.S16LE)
    kept.append(b"\0\0" * 10)
    info = kept.commit()
    writing = store.begin("job-crashed", 24000, PcmEncoding.S16LE)
    writing.append(b"\0\0" * 10)
    (tmp_path / f".{'art-' + 'b' * 32}.json.partial").write_text("{")
    orphan = tmp_path / f"{'art-' + 'c' * 32}.wav"  # renamed, but the sidecar never written
    orphan.write_bytes(b"RIFF")
    store.close()  # a restart: nothing is being written now
    _store(tmp_path)
    assert _files(tmp_path) == sorted([f"{info.artifact_id}.json", f"{info.artifact_id}.wav"])


def _committed(store: ArtifactStore, job: str, size: int, age_s: float) -> str:
    writer = store.begin(job, 24000, PcmEncoding.S16LE)
    writer.append(b"\0" * size)
    info = writer.commit()
    path = store.sidecar_path(info.artifact_id)
    record = json.loads(path.read_text())
    record["committed_at_ns"] = time.time_ns() - int(age_s * 1e9)
    path.write_text(json.dumps(record))
    return info.artifact_id


def test_headroom_evicts_the_oldest_artifacts_past_min_keep_then_degrades(tmp_path):
    with small_tmpfs(tmp_path / "disk", 4 * MIB) as disk:
        store = _store(disk, min_keep_s=60)
        oldest = _committed(store, "job-a", 600_000, age_s=600)
        older = _committed(store, "job-b", 600_000, age_s=300)
        young = _committed(store, "job-c", 600_000, age_s=5)
        fill(disk, leave_bytes=700_000)  # something else takes the disk
        store.settings = ArtifactSettings(directory=disk, min_free_bytes=1 * MIB, min_keep_s=60)
        writer = store.begin("job-d", 24000, PcmEncoding.S16LE)
        assert writer.unavailable_reason is None  # one eviction made room
        assert store.list_ids() == sorted([older, young]) and oldest not in store.list_ids()
        writer.abort()
        fill(disk, leave_bytes=100_000)
        refused = store.begin("job-e", 24000, PcmEncoding.S16LE)  # `older` goes too, `young` is protected
        assert refused.unavailable_reason and "headroom" in refused.unavailable_reason
        assert store.list_ids() == [young]
        refused.append(b"\0" * 1000)  # an unavailable writer writes nothing
        assert refused.commit() is None and not list(disk.glob(".art-*"))
        status = store.status()
        assert status.degraded and "headroom" in status.reason and status.evicted == 2
        assert status.unavailable == {"headroom": 1}
        (disk / "hog.bin").unlink()
        store.space.refresh()  # the upkeep's probe write succeeds: no longer degraded
        assert not store.status().degraded
        assert store.begin("job-f", 24000, PcmEncoding.S16LE).commit() is not None
        assert os.path.exists(store.wav_path(young))


def _writers(store: ArtifactStore, n: int) -> list:
    writers = []
    for i in range(n):
        w = store.begin(f"job-{i}", 24000, PcmEncoding.S16LE)
        w.append(bytes([i]) * (4000 + 2 * i))
        writers.append(w)
    return writers


def test_a_group_commit_shares_its_syncs_and_each_artifact_is_whole(tmp_path, monkeypatch):
    """Three artifacts committed together: one syncfs for their WAVs, one for their sidecars, one directory
    fsync, no fsync of a file; each is then whole (size, hash) and described by its sidecar."""
    from breeze_worker.artifacts import store as store_module

    store = _store(tmp_path)
    writers = _writers(store, 3)
    calls = {"syncfs": 0, "fsync": 0}
    real_syncfs, real_fsync = store_module._syncfs, os.fsync

    def syncfs(fd):
        calls["syncfs"] += 1
        return real_syncfs(fd)

    def fsync(fd):
        calls["fsync"] += 1
        return real_fsync(fd)

    monkeypatch.setattr(store_module, "_syncfs", syncfs)
    monkeypatch.setattr(store_module.os, "fsync", fsync)
    infos = store.commit_together(writers)
    assert calls == {"syncfs": 2, "fsync": 1}  # the one fsync: the directory's
    assert len({info.commit.started_at_ns for info in infos}) == 1
    for i, info in enumerate(infos):
        data = store.wav_path(info.artifact_id).read_bytes()
        assert len(data) == info.size_bytes == 44 + 4000 + 2 * i and data.endswith(bytes([i]) * (4000 + 2 * i))
        assert hashlib.sha256(data).hexdigest() == info.sha256 == store.describe(info.artifact_id)["sha256"]
        assert store.describe(info.artifact_id)["job_id"] == f"job-{i}"
    assert not list(tmp_path.glob(".*partial"))


def test_syncfs_works_on_this_kernel(tmp_path):
    """The ctypes binding against the real system call (Linux 5.8 and later: every host these tests run on)."""
    from breeze_worker.artifacts import store as store_module

    assert store_module._syncfs_usable()
    with open(tmp_path / "f", "wb") as f:
        f.write(b"x")
        assert store_module._syncfs(f.fileno()) is True


def test_a_failed_sync_in_a_group_gives_up_that_artifact_only(tmp_path, monkeypatch):
    """The group's syncfs fails (a write-back error somewhere on the volume): the store syncs file by file,
    which names the failing file; that artifact is given up and left nowhere, the others commit."""
    from breeze_worker.artifacts import store as store_module

    store = _store(tmp_path)
    writers = _writers(store, 3)
    real_fsync = os.fsync

    def fsync(fd):  # the second WAV's data fails to reach the disk
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f".{writers[1].artifact_id}.partial"):
            raise OSError(5, os.strerror(5))
        return real_fsync(fd)

    monkeypatch.setattr(store_module, "_syncfs", lambda fd: False)
    monkeypatch.setattr(store_module.os, "fsync", fsync)
    infos = store.commit_together(writers)
    assert infos[0] is not None and infos[2] is not None and infos[1] is None
    assert "I/O error" in writers[1].unavailable_reason
    assert _files(tmp_path) == sorted(f"{i.artifact_id}.{ext}" for i in (infos[0], infos[2]) for ext in ("json", "wav"))


def test_the_read_back_for_the_hashes_runs_while_the_wavs_sync(tmp_path, monkeypatch):
    """The WAVs' sync waits (up to 5 s) for a read-back to begin: it does when the hashing runs alongside the
    sync, and the artifacts are whole; hashing only after the sync would leave the sync waiting in vain."""
    import threading

    from breeze_worker.artifacts import store as store_module

    store = _store(tmp_path)
    writers = _writers(store, 3)
    hashing, seen_during_sync = threading.Event(), []
    real_syncfs, real_digest = store_module._syncfs, hashlib.file_digest

    def syncfs(fd):
        if not seen_during_sync:  # the first sync: the WAVs'
            seen_during_sync.append(hashing.wait(5.0))
        return real_syncfs(fd)

    def file_digest(f, name):
        hashing.set()
        return real_digest(f, name)

    monkeypatch.setattr(store_module, "_syncfs", syncfs)
    monkeypatch.setattr(store_module.hashlib, "file_digest", file_digest)
    started = time.perf_counter_ns()
    infos = store.commit_together(writers)
    elapsed = time.perf_counter_ns() - started
    assert seen_during_sync == [True]
    for info in infos:
        data = store.wav_path(info.artifact_id).read_bytes()
        assert hashlib.sha256(data).hexdigest() == info.sha256 and len(data) == info.size_bytes
    # the recorded steps do not overlap (the read-back counts only after the sync), so they fit in the commit
    timing = infos[0].commit
    steps = (timing.wav_fsync_ns, timing.hash_ns, timing.rename_ns, timing.sidecar_fsync_ns, timing.dir_fsync_ns)
    assert min(steps) >= 0 and timing.wav_fsync_ns > 0 and sum(steps) <= elapsed


def test_a_failed_read_back_in_a_group_gives_up_that_artifact_only(tmp_path, monkeypatch):
    """Reading the second WAV back for its hash fails with EIO: that artifact is given up and left nowhere,
    the others commit whole."""
    from breeze_worker.artifacts import store as store_module

    store = _store(tmp_path)
    writers = _writers(store, 3)
    real_digest = hashlib.file_digest

    def file_digest(f, name):
        if str(f.name).endswith(f".{writers[1].artifact_id}.partial"):
            raise OSError(5, os.strerror(5))
        return real_digest(f, name)

    monkeypatch.setattr(store_module.hashlib, "file_digest", file_digest)
    infos = store.commit_together(writers)
    assert infos[0] is not None and infos[2] is not None and infos[1] is None
    assert "I/O error" in writers[1].unavailable_reason
    assert _files(tmp_path) == sorted(f"{i.artifact_id}.{ext}" for i in (infos[0], infos[2]) for ext in ("json", "wav"))
    for info in (infos[0], infos[2]):
        assert hashlib.sha256(store.wav_path(info.artifact_id).read_bytes()).hexdigest() == info.sha256


@pytest.mark.parametrize("step", ["read-back", "sidecars"])
def test_an_error_not_of_the_disk_takes_the_whole_group_off_disk(tmp_path, monkeypatch, step):
    """A bug, not a disk fault, in a group commit: in the read-back (no WAV renamed yet) or at the sidecars
    (every WAV already renamed into place). The error reaches the caller and no artifact of the group is left:
    no WAV, no sidecar, no temp file."""
    from breeze_worker.artifacts import store as store_module

    store = _store(tmp_path)
    writers = _writers(store, 3)
    if step == "read-back":
        monkeypatch.setattr(store_module.hashlib, "file_digest", lambda f, name: 1 / 0)
    else:
        monkeypatch.setattr(store_module.json, "dump", lambda record, f: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        store.commit_together(writers)
    assert _files(tmp_path) == []
    assert all(store.list_ids() == [] and w.unavailable_reason is None for w in writers)


def test_a_disk_full_at_the_sidecars_step_of_a_group_commit_leaves_no_half_artifact(tmp_path):
    """A real full tmpfs: the WAVs' data went out before the disk filled, so their headers, syncs and renames
    succeed; a sidecar (a new file) that does not fit gives its artifact up, its renamed WAV removed too
    (which frees room for the next ones): a reader never finds a WAV without its sidecar, nor a temp file."""
    with small_tmpfs(tmp_path / "disk", 2 * MIB) as disk:
        store = _store(disk)
        writers = _writers(store, 4)
        for w in writers:
            w._file.flush()
        fill(disk)
        infos = store.commit_together(writers)
        assert infos[0] is None and "disk is full" in writers[0].unavailable_reason
        for w, info in zip(writers, infos):
            if info is None:
                assert not store.wav_path(w.artifact_id).exists() and not store.sidecar_path(w.artifact_id).exists()
            else:
                assert store.wav_path(w.artifact_id).stat().st_size == info.size_bytes
                assert store.describe(w.artifact_id)["sha256"] == info.sha256
        assert not list(disk.glob(".*partial"))
