"""Write-back while streaming: the blocks a writer hands to the kernel are queued for write-back at once, so a
commit's sync finds them already on their way to the disk, and the commit counts only what its sync still wrote.
Observed through the kernel's own page-cache state (cachestat, Linux 6.5 and later, called here by the test
itself) on a disk-backed file system, against a store with the hints turned off."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import threading
import time

import pytest

from breeze_worker.artifacts import syscalls
from breeze_worker.artifacts.store import WRITE_BUFFER_BYTES, ArtifactStore, _WriteBack
from breeze_worker.artifacts.syscalls import PAGE_BYTES
from breeze_worker.config import ArtifactSettings
from breeze_worker.engine.types import PcmEncoding

FRAME_BYTES = 3840  # one 80 ms frame of 24 kHz s16 audio
FRAME = os.urandom(FRAME_BYTES)
FRAMES = 110  # six blocks of WRITE_BUFFER_BYTES written out, the rest still in the writer's buffer
CACHESTAT = 451  # the system call's number on x86-64 and arm64 alike


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def _page_state(path, nbytes: int, offset: int = 0) -> _Stat:
    """The kernel's page-cache counts for `nbytes` of the file from `offset`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        stat = _Stat()
        if libc.syscall(CACHESTAT, fd, ctypes.byref(_Range(offset, nbytes)), ctypes.byref(stat), 0) != 0:
            raise OSError(ctypes.get_errno(), "cachestat")
        return stat
    finally:
        os.close(fd)


def _dirty_pages(path, nbytes: int) -> int:
    """The kernel's count of dirty pages in the first `nbytes` of the file."""
    return _page_state(path, nbytes).nr_dirty


def _kernel_has_cachestat() -> bool:
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return platform.system() == "Linux" and found is not None and (int(found[1]), int(found[2])) >= (6, 5)


def _disk_backed(path) -> bool:
    best, fstype = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, point, kind = line.split()[:3]
            if str(path).startswith(point) and len(point) > len(best):
                best, fstype = point, kind
    return fstype not in ("tmpfs", "ramfs", "overlay", "")


def _write(store: ArtifactStore):
    writer = store.begin("job-1", 24000, PcmEncoding.S16LE)
    for _ in range(FRAMES):
        writer.append(FRAME)
    return writer


@pytest.mark.skipif(not _kernel_has_cachestat(), reason="cachestat needs Linux 6.5 or later")
def test_the_blocks_written_out_are_under_write_back_before_the_commit(tmp_path):
    if not _disk_backed(tmp_path):
        pytest.skip(f"{tmp_path} is not on a disk-backed file system: nothing is written back there")
    hinted = ArtifactStore(ArtifactSettings(directory=tmp_path / "hinted", min_free_bytes=0))
    unhinted = ArtifactStore(ArtifactSettings(directory=tmp_path / "unhinted", min_free_bytes=0))
    assert hinted._writeback is not None  # Linux: the C library has sync_file_range
    unhinted._writeback = None

    writers = [_write(hinted), _write(unhinted)]
    hinted._writeback.drain()
    written = [w._written for w in writers]
    assert written[0] == written[1] >= 6 * WRITE_BUFFER_BYTES  # the same blocks reached the kernel in both
    whole = writers[0]._hinted  # every page written whole so far (the last one may wait for the next block)
    assert written[0] - PAGE_BYTES < whole <= written[0] and whole % PAGE_BYTES == 0
    # without hints the kernel leaves them dirty for its own timer (tens of seconds): the test can tell
    assert _dirty_pages(writers[1]._temp_path, whole) > whole // PAGE_BYTES // 2
    assert _dirty_pages(writers[0]._temp_path, whole) == 0

    for w in writers:  # and the artifact is the streamed audio, byte for byte, as without hints
        info = w.commit()
        raw = w._store.wav_path(info.artifact_id).read_bytes()
        assert raw[44:] == FRAME * FRAMES and hashlib.sha256(raw).hexdigest() == info.sha256


class _Recorder:
    """Stands in for sync_file_range: records (the file's inode, offset, bytes, flags) of each call, returns
    `result` (errno EIO when it fails); with `hold`, each call waits until it is set, as on a busy volume
    (`returned` is set once a call has returned)."""

    def __init__(self, result: int = 0, hold: threading.Event | None = None) -> None:
        self.calls: list[tuple[int, int, int, int]] = []
        self.after: list[int | None] = []  # the descriptor's inode when the call returns (None: closed)
        self.result = result
        self.hold = hold
        self.entered = threading.Event()
        self.returned = threading.Event()

    def __call__(self, fd: int, offset: int, nbytes: int, flags: int) -> int:
        self.calls.append((os.fstat(fd).st_ino, offset, nbytes, flags))
        self.entered.set()
        if self.hold is not None:
            self.hold.wait()  # the test sets it in its `finally`
        try:
            self.after.append(os.fstat(fd).st_ino)
        except OSError:
            self.after.append(None)
        self.returned.set()
        if self.result:
            ctypes.set_errno(5)
        return self.result


def _open_descriptors(under) -> int:
    """This process's descriptors of files under `under` (a test's own directory: what earlier tests left open
    may be closed by the garbage collector at any moment)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"{under}/")
        except OSError:  # closed since the listing
            pass
    return count


def test_each_block_is_hinted_once_in_order(tmp_path):
    store = ArtifactStore(ArtifactSettings(directory=tmp_path, min_free_bytes=0))
    recorder = _Recorder()
    store._writeback = writeback = _WriteBack(recorder)
    before = _open_descriptors(tmp_path)
    writer = _write(store)
    writeback.drain()
    assert _open_descriptors(tmp_path) == before + 1  # the writer's own file, nothing more
    inode = os.fstat(writer._file.fileno()).st_ino
    blocks = [(offset, nbytes) for _, offset, nbytes, _ in recorder.calls]
    assert blocks and all(call[0] == inode and call[3] == syscalls.SYNC_FILE_RANGE_WRITE
                          for call in recorder.calls)
    assert blocks[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(blocks, blocks[1:]))  # contiguous
    assert all((offset + nbytes) % PAGE_BYTES == 0 for offset, nbytes in blocks)  # whole pages only
    end = blocks[-1][0] + blocks[-1][1]
    assert end == writer._hinted and writer._written - PAGE_BYTES < end <= writer._written  # all but a part page
    assert all(nbytes > WRITE_BUFFER_BYTES - PAGE_BYTES for _, nbytes in blocks)  # a hint a block, not a frame


def test_a_write_back_call_that_blocks_holds_up_no_abort_and_no_commit(tmp_path):
    """The engine thread aborts a cancelled job's artifact: it must not wait for a write-back call stuck on a
    busy volume. The file is removed at once, and closed by the write-back thread once its call returns.

    The call is held until the end of the test, so abort and commit returning at all, with the call not yet
    returned, is the verdict; the 120 s bounds only a wait that a regression would make endless."""
    store = ArtifactStore(ArtifactSettings(directory=tmp_path, min_free_bytes=0))
    hold = threading.Event()
    recorder = _Recorder(hold=hold)
    store._writeback = writeback = _WriteBack(recorder)
    before = _open_descriptors(tmp_path)
    try:
        aborted, committed = _write(store), _write(store)
        assert recorder.entered.wait(120)  # the write-back thread is inside a call that does not return
        results: list = []
        workers = [threading.Thread(target=aborted.abort), threading.Thread(target=lambda: results.append(
            committed.commit()))]
        for t in workers:
            t.start()
        for t in workers:
            t.join(120)
        assert not any(t.is_alive() for t in workers) and not recorder.returned.is_set()
        assert not list(tmp_path.glob(".art-*"))  # the aborted temp file is gone, the other one committed
        info = results[0]
        raw = store.wav_path(info.artifact_id).read_bytes()
        assert raw[44:] == FRAME * FRAMES and hashlib.sha256(raw).hexdigest() == info.sha256
    finally:
        hold.set()
        writeback.drain()
    assert _open_descriptors(tmp_path) == before  # the aborted file was closed after the call it was under
    assert recorder.after[0] == recorder.calls[0][0]  # not before: the call's descriptor stayed that file's


def test_a_failing_write_back_is_logged_once_and_commits_stay_whole(tmp_path, caplog):
    store = ArtifactStore(ArtifactSettings(directory=tmp_path, min_free_bytes=0))
    store._writeback = _WriteBack(_Recorder(result=-1))
    with caplog.at_level("WARNING", logger="breeze_worker.artifacts.store"):
        writers = [_write(store) for _ in range(2)]
        store._writeback.drain()
        infos = store.commit_together(writers)
    assert caplog.text.count("starting write-back failed (Input/output error)") == 1
    assert len(infos) == 2
    for info in infos:
        raw = store.wav_path(info.artifact_id).read_bytes()
        assert raw[44:] == FRAME * FRAMES and hashlib.sha256(raw).hexdigest() == info.sha256


def _sidecar_bytes(store: ArtifactStore, info) -> int:
    return store.sidecar_path(info.artifact_id).stat().st_size


@pytest.mark.skipif(not _kernel_has_cachestat(), reason="cachestat needs Linux 6.5 or later")
def test_a_commit_counts_only_the_bytes_its_sync_still_wrote(tmp_path, monkeypatch):
    """The diagnosis divides `bytes_synced` by the sync's time to name a volume's rate: with the blocks written
    back during the stream, only what the kernel still holds in memory when the sync starts counts (the tail
    written at the commit and the header's part of the file, rewritten then; a large folio's pages count whole);
    without hints, the whole WAV, as before."""
    if not _disk_backed(tmp_path):
        pytest.skip(f"{tmp_path} is not on a disk-backed file system: nothing is written back there")
    hinted = ArtifactStore(ArtifactSettings(directory=tmp_path / "hinted", min_free_bytes=0))
    unhinted = ArtifactStore(ArtifactSettings(directory=tmp_path / "unhinted", min_free_bytes=0))
    assert hinted._writeback is not None  # this kernel answers cachestat, so the store hints
    unhinted._writeback = None
    writers = [_write(hinted), _write(unhinted)]
    hinted._writeback.drain()
    whole = writers[0]._hinted
    deadline = time.monotonic() + 120  # the hinted pages reach the disk (the write-back was only started; a
    while True:                        # volume busy with other writers takes its time)
        state = _page_state(writers[0]._temp_path, whole)
        if state.nr_writeback == 0 and state.nr_dirty <= 1:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the hinted pages of {writers[0]._temp_path} were not written back within 120 s")
        time.sleep(0.01)
    at_sync: dict = {}  # the kernel's count of each WAV's unwritten pages as the commit's sync begins
    sync = ArtifactStore._sync

    def recording_sync(store, files):
        for w, f in files:
            if w not in at_sync:  # the WAV's sync (the sidecar's comes after it)
                state = _page_state(f"/proc/self/fd/{f.fileno()}", 0)
                at_sync[w] = (state.nr_dirty + state.nr_writeback) * PAGE_BYTES
        return sync(store, files)

    monkeypatch.setattr(ArtifactStore, "_sync", recording_sync)
    size = 44 + FRAME_BYTES * FRAMES
    tail = size - writers[0]._written  # still in the writer's buffer: written at the commit
    infos = [w.commit() for w in writers]
    assert all(info.size_bytes == size for info in infos)
    wav_counted = infos[0].commit.bytes_synced - _sidecar_bytes(hinted, infos[0])
    assert wav_counted == min(size, at_sync[writers[0]])
    assert tail <= wav_counted < size // 4  # most of the audio was on the disk before the commit
    assert infos[1].commit.bytes_synced == size + _sidecar_bytes(unhinted, infos[1])
    assert at_sync[writers[1]] >= size - PAGE_BYTES  # unhinted, the pages were still dirty: counting all is right


def test_under_the_simulated_slow_volume_nothing_is_hinted_and_the_whole_wav_counts(tmp_path):
    """The test-only write fault stands for a volume that writes everything at the sync: a writer hints
    nothing, and the commit sleeps for, and counts, the whole WAV."""
    store = ArtifactStore(ArtifactSettings(directory=tmp_path, min_free_bytes=0,
                                           fault_storage_write_bytes_per_s=100 * 1024 * 1024))
    recorder = _Recorder()
    store._writeback = writeback = _WriteBack(recorder)
    writer = _write(store)
    writeback.drain()
    assert recorder.calls == [] and writer._hinted == 0
    info = writer.commit()
    assert info.commit.bytes_synced == 44 + FRAME_BYTES * FRAMES + _sidecar_bytes(store, info)


def test_where_the_kernel_cannot_count_unwritten_pages_nothing_is_hinted(tmp_path, monkeypatch, caplog):
    """Before Linux 6.5, or where a seccomp profile refuses cachestat, the commit could not say what its sync
    wrote: the store hints nothing, says so once, and counts the whole WAV."""
    monkeypatch.setattr(syscalls, "_libc_syscall", lambda: None)
    with caplog.at_level("INFO", logger="breeze_worker.artifacts.store"):
        store = ArtifactStore(ArtifactSettings(directory=tmp_path, min_free_bytes=0))
    assert store._writeback is None and "no write-back while streaming" in caplog.text
    writer = _write(store)
    assert writer._hinted == 0
    info = writer.commit()
    assert info.commit.bytes_synced == 44 + FRAME_BYTES * FRAMES + _sidecar_bytes(store, info)
