"""The artifact store: one WAV per job, written while streaming, committed atomically, served by id.

Layout of the store directory:
    art-<32 hex>.wav      the committed WAV (header + exactly the PCM streamed to the client)
    art-<32 hex>.json     its sidecar: size, sha256, commit time, job id, sample rate, encoding
    .art-<32 hex>.partial a job still writing (never served; removed by abort or by retention)
    .breeze-worker.lock   the lock that keeps a second worker out, with its holder's pid and addresses

An artifact exists for readers once its sidecar exists; the sidecar is written (temp file, fsync,
rename) only after the WAV itself was fsynced and renamed into place. Ids are unguessable
("art-" + 128 random bits) and every id is checked against the pattern before any file-system access.

A storage fault (ENOSPC, EIO, a read-only disk) fails one artifact, never its job: the writer removes its
temp file, stops writing and reports why (`unavailable_reason`), and the job streams on without an artifact.
Opening the store locks its directory (`dirlock.py`: one worker per directory), then sweeps the temp files a
crashed run left; `space.py` keeps the free-space headroom.
Every commit step is timed (`ArtifactInfo.commit`, also kept in the sidecar): the evidence that tells a
slow volume from a worker that was slow around its storage calls.

Write-back while streaming: each block of PCM a writer hands to the kernel is queued for write-back at once
(`sync_file_range`, on the store's write-back thread: the call can block while the volume is busy), so the
commit's sync finds most of a job's audio already on its way to the disk instead of all of it dirty in memory.
It changes when the data moves, not what a commit guarantees: the commit still syncs every WAV. The commit's
timing then counts the bytes its sync still had to write (`CommitTiming.bytes_synced`): the WAV's pages the
kernel holds dirty or under write-back when the sync begins (`cachestat`, Linux 6.5 and later), so that bytes
over sync time stays the volume's rate, the figure the retrieval diagnosis reports. Where the kernel cannot
say, nothing is queued early and the whole WAV is counted, as before.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import hashlib
import io
import json
import logging
import mmap
import os
import queue
import re
import secrets
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar

from breeze_worker.artifacts.dirlock import DirectoryLock
from breeze_worker.artifacts.space import SpaceKeeper, StoreStatus
from breeze_worker.artifacts.wav import header_size, wav_header
from breeze_worker.config import ArtifactSettings
from breeze_worker.engine.types import ArtifactInfo, CommitTiming, PcmEncoding
from breeze_worker.errors import InvalidRequest, NotFound

log = logging.getLogger(__name__)

ARTIFACT_ID_PATTERN = re.compile(r"art-[0-9a-f]{32}")
WRITE_BUFFER_BYTES = 64 * 1024  # ~1.4 s of 24 kHz s16 audio (17 frames) between writes to the file
_Owner = TypeVar("_Owner")  # what a synced file belongs to (`ArtifactStore._sync`)
COMMIT_READERS = 4  # threads reading a group commit's WAVs back for their hashes
_ORPHAN_GRACE_S = 60.0  # a WAV without sidecar younger than this may be mid-commit


def new_artifact_id() -> str:
    return "art-" + secrets.token_hex(16)


def check_artifact_id(artifact_id: str) -> str:
    """Return the id if well formed; raise InvalidRequest (before touching the file system) otherwise."""
    if not isinstance(artifact_id, str) or ARTIFACT_ID_PATTERN.fullmatch(artifact_id) is None:
        shown = repr(artifact_id)[:60]
        raise InvalidRequest(
            f"artifact id {shown} is malformed: pass the id from the job's final message "
            "('art-' followed by 32 lowercase hex digits)"
        )
    return artifact_id


def _syncfs_usable() -> bool:
    """syncfs reports write-back errors since Linux 5.8; before, it could return success after a failed
    write-back, so it is used only there."""
    system = os.uname()
    if system.sysname != "Linux":
        return False
    found = re.match(r"(\d+)\.(\d+)", system.release)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (5, 8)


@functools.cache
def _libc_syncfs():
    """The C library's syncfs, where it is usable (`_syncfs_usable`); else None."""
    if not _syncfs_usable():
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    return function


def _syncfs(fd: int) -> bool:
    """Flush the whole file system holding `fd` (one call for a group of files); False when syncfs is not
    usable here or failed (the caller syncs file by file, which names the failing file)."""
    function = _libc_syncfs()
    if function is None:
        return False
    if function(fd) != 0:
        log.warning("syncfs on the artifact volume failed (%s); syncing file by file",
                    os.strerror(ctypes.get_errno()))
        return False
    return True


@functools.cache
def _libc_sync_file_range():
    """The C library's sync_file_range (Linux), else None."""
    if os.uname().sysname != "Linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


SYNC_FILE_RANGE_WRITE = 2  # start write-back of the range's dirty pages; wait for nothing
PAGE_BYTES = mmap.PAGESIZE  # write-back moves whole pages: a hint ends at the last page already written whole


class _WriteBack:
    """One thread that starts the kernel's write-back of the blocks the writers hand it (`queue`).

    A writer that lets go of its file (commit, abort) never waits for a call, which may block while the volume
    is busy (the engine thread aborts): when a call on that file is in progress, this thread closes the file
    after it (`ArtifactWriter._let_go`), so the descriptor is never closed, nor its number reused, under a call.
    A hint for a file let go of is dropped. A failed call is only logged: write-back errors reach the commit
    through its sync, which names the artifact."""

    def __init__(self, function) -> None:
        self._function = function
        self._hints: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.failed = False  # a call failed (logged once)

    def queue(self, writer: ArtifactWriter, offset: int, nbytes: int) -> None:
        """Start the write-back of `nbytes` from `offset` of the writer's file."""
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="artifact-writeback", daemon=True)
                    self._thread.start()
        self._hints.put((writer, offset, nbytes))

    def drain(self) -> None:
        """Wait until every hint queued before this call has been handled (tests)."""
        done = threading.Event()
        self._hints.put(done)
        if self._thread is not None:
            done.wait()

    def _run(self) -> None:
        while True:
            hint = self._hints.get()
            if isinstance(hint, threading.Event):
                hint.set()
                continue
            writer, offset, nbytes = hint
            with writer._guard:
                f = writer._file
                if f is None:
                    continue
                writer._hinting = True
            try:
                failed = self._function(f.fileno(), offset, nbytes, SYNC_FILE_RANGE_WRITE) != 0
                error = ctypes.get_errno()
            except Exception:  # noqa: BLE001 - a hint is never worth this thread
                failed, error = True, errno.EIO
            finally:
                with writer._guard:
                    writer._hinting = False
                    let_go, writer._let_go_during_hint = writer._let_go_during_hint, None
                if let_go is not None:
                    ArtifactStore._close_quietly(let_go)
            if failed and not self.failed:
                self.failed = True
                log.warning("artifact volume: starting write-back failed (%s); commits sync everything at the end",
                            os.strerror(error))


@functools.cache
def _process_writeback() -> _WriteBack | None:
    """The process's one write-back thread (every store shares it), or None where sync_file_range is missing."""
    function = _libc_sync_file_range()
    return _WriteBack(function) if function is not None else None


CACHESTAT_SYSCALL = 451  # Linux 6.5+; one number on x86-64 and arm64 (and every architecture of the generic table)


class _CacheRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]  # len 0: to the end of the file


class _CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


@functools.cache
def _libc_syscall():
    """The C library's `syscall` where cachestat's number is known (Linux on x86-64 or arm64), else None."""
    if os.uname().sysname != "Linux" or os.uname().machine not in ("x86_64", "aarch64"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return function


def unsynced_bytes(fd: int, size: int) -> int | None:
    """Of the file's first `size` bytes, those the kernel still has to write to the volume: its pages that are
    dirty or under write-back (cachestat), counted whole and capped at `size`. None where the kernel cannot say
    (before Linux 6.5, another system, a call refused)."""
    function = _libc_syscall()
    if function is None:
        return None
    stat = _CacheStat()
    if function(CACHESTAT_SYSCALL, ctypes.c_uint(fd), ctypes.byref(_CacheRange(0, 0)), ctypes.byref(stat),
                ctypes.c_uint(0)) != 0:
        return None
    return min(size, (stat.nr_dirty + stat.nr_writeback) * PAGE_BYTES)


def _counts_unsynced(directory: Path) -> bool:
    """Whether `unsynced_bytes` answers for files in `directory` (tried once on a file of its own)."""
    try:
        with tempfile.TemporaryFile(dir=directory) as f:
            f.write(b"\0")
            f.flush()
            return unsynced_bytes(f.fileno(), 1) is not None
    except OSError:
        return False


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ArtifactWriter:
    """Writes one job's WAV while it streams; `commit` makes it visible, `abort` discards it.

    An OSError while writing or committing gives the artifact up (temp file removed, `unavailable_reason`
    set) instead of raising: the job's audio stream must not end because its copy on disk could not be kept.
    A writer created unavailable (`unavailable=` reason) writes nothing at all.
    """

    def __init__(self, store: ArtifactStore, artifact_id: str, job_id: str, sample_rate: int,
                 encoding: PcmEncoding, *, unavailable: str | None = None) -> None:
        self.artifact_id = artifact_id
        self.job_id = job_id
        self.sample_rate = sample_rate
        self.encoding = PcmEncoding(encoding)
        self._store = store
        self._temp_path = store.directory / f".{artifact_id}.partial"
        self._file: io.FileIO | None = None  # exclusive create, read and write
        # the write-back thread's claim on the file: `_guard` is held only to look at or change these (never
        # across a system call); a file let go of during a call is closed by that thread after it
        self._guard = threading.Lock()
        self._hinting = False
        self._let_go_during_hint: io.FileIO | None = None
        # the writer's own buffer: the engine thread appends every stream's frame (~4 KB) each step, and a write
        # call per frame would be a system call (and a hand-over of the interpreter lock) per stream; each block
        # written out is then handed to the write-back thread
        self._buffer = bytearray(header_size(self.encoding))  # the header, reserved; filled in at commit
        self._written = 0  # bytes of the file written out to the kernel
        self._hinted = 0  # the file's first bytes queued for write-back (whole pages)
        self._data_bytes = 0
        self._info: ArtifactInfo | None = None
        self.unavailable_reason: str | None = unavailable
        if unavailable is not None:
            return
        try:
            self._file = io.FileIO(self._temp_path, "x+")
        except OSError as exc:
            self._give_up(exc)

    @property
    def data_bytes(self) -> int:
        return self._data_bytes

    def append(self, pcm: bytes) -> None:
        """Append PCM exactly as it was streamed to the client (nothing once the artifact was given up)."""
        if self.unavailable_reason is not None:
            return
        if self._file is None:
            raise RuntimeError(f"artifact {self.artifact_id} is already committed or aborted")
        try:
            self._fault_check(len(pcm))
            self._buffer += pcm
            if len(self._buffer) >= WRITE_BUFFER_BYTES:
                self._write_out(hint=True)
        except OSError as exc:
            self._give_up(exc)
            return
        self._data_bytes += len(pcm)

    def _write_out(self, hint: bool) -> None:
        """Write the buffer to the file; with `hint`, queue the write-back of the pages it completed (a commit
        follows otherwise). A page the next block still writes into is left for that block's hint: hinted while
        half written, it would be under write-back when the rest arrives, and the next hint would skip it."""
        assert self._file is not None
        view = memoryview(self._buffer)
        while view:
            n = self._file.write(view)  # a regular file in blocking mode: a short write only before an error
            view = view[n:]
            self._written += n
        view.release()
        self._buffer.clear()
        writeback = self._store._early_writeback()
        whole = self._written - self._written % PAGE_BYTES
        if hint and writeback is not None and whole > self._hinted:
            writeback.queue(self, self._hinted, whole - self._hinted)
            self._hinted = whole

    def commit(self) -> ArtifactInfo | None:
        """Fix the header, fsync, rename into place, record the sha256; returns the committed info, whose
        commit time is after the last sync (WAV, sidecar, directory) and whose `commit` times each step, or
        None when the artifact was given up (`unavailable_reason` says why). `ArtifactStore.commit_together`
        commits several at once."""
        return self._store.commit_together([self])[0]

    # ---- the steps of a commit (ArtifactStore.commit_together runs them for a group) ----
    def _seal(self) -> bool:
        """Write out the buffered rest and the final header (no sync yet); False when the disk failed it (given
        up)."""
        assert self._file is not None
        try:
            self._write_out(hint=False)
            header = wav_header(self.encoding, self.sample_rate, self._data_bytes)
            if os.pwrite(self._file.fileno(), header, 0) != len(header):
                raise OSError(errno.EIO, "the WAV header was written short", str(self._temp_path))
        except OSError as exc:
            self._give_up(exc)
            return False
        return True

    def _digest(self) -> tuple[str, int] | OSError:
        """Read the sealed WAV back for its (sha256, size), or the disk's error (the commit's thread gives the
        artifact up: this runs on a read-back thread while that one syncs the group)."""
        f = self._file
        assert f is not None
        try:
            f.seek(0)
            digest = hashlib.file_digest(f, "sha256").hexdigest()
            return digest, f.seek(0, os.SEEK_END)
        except OSError as exc:
            return exc

    def _publish_wav(self) -> bool:
        """After the sync and the read-back: close the WAV and rename it into place; False when the disk
        failed it (given up; the rename is the last step, so nothing is in place)."""
        assert self._file is not None
        try:
            f = self._let_go()
            if f is not None:
                f.close()
            os.replace(self._temp_path, self._store.wav_path(self.artifact_id))
        except OSError as exc:
            self._give_up(exc)
            return False
        except BaseException:
            self.abort()
            raise
        return True

    def _let_go(self) -> io.FileIO | None:
        """Give up the file: returned for the caller to close, or None when a write-back call on it is in
        progress (the write-back thread closes it after the call) or it was let go of before."""
        with self._guard:
            f, self._file = self._file, None
            if f is not None and self._hinting:
                self._let_go_during_hint, f = f, None
        return f

    def _unpublish(self, exc: BaseException) -> None:
        """A commit step after the rename failed: readers lose sight of the artifact (sidecar first), and
        neither temp file (the WAV's, the sidecar's) stays behind."""
        store = self._store
        store._remove_quietly(store.sidecar_path(self.artifact_id))
        store._remove_quietly(store.wav_path(self.artifact_id))
        store._remove_quietly(store._sidecar_temp_path(self.artifact_id))
        self._remove_temp()
        if isinstance(exc, OSError):
            self._give_up(exc)

    def _committed(self, info: ArtifactInfo) -> None:
        self._info = info
        self._store.space.write_succeeded()
        log.info("artifact %s committed for job %s: %d bytes, sha256 %s", info.artifact_id, self.job_id,
                 info.size_bytes, info.sha256)

    def abort(self) -> None:
        """Discard the temporary file and what is still buffered; a committed artifact is left alone. Removes the
        file even when closing it fails."""
        if self._info is not None:
            return
        f = self._let_go()
        try:
            if f is not None:
                f.close()
        except OSError as exc:
            log.debug("artifact %s: closing its temp file failed (%s); removing it anyway", self.artifact_id, exc)
        finally:
            self._remove_temp()

    def _give_up(self, exc: OSError) -> None:
        """The disk failed this artifact: remove what was written and remember why; the job goes on."""
        self.abort()
        words = self._store.space.artifact_given_up(exc)
        self.unavailable_reason = f"{words} while writing it; the streamed audio was complete, no artifact was kept"
        log.warning("job %s: artifact %s given up after %d bytes: %s", self.job_id, self.artifact_id,
                    self._data_bytes, words)

    def _fault_check(self, n: int) -> None:
        limit = self._store.settings.fault_eio_after_bytes
        if limit and self._data_bytes + n > limit:  # test-only fault injection (storage-fault tests)
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self._temp_path))

    def _remove_temp(self) -> None:
        self._store._remove_quietly(self._temp_path)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self._info is None:
            self.abort()


class ArtifactStore:
    """Committed WAV artifacts under one directory, with retention by age and total size."""

    def __init__(self, settings: ArtifactSettings, holder: dict | None = None) -> None:
        """Open the store: lock its directory for this process before anything in it is touched (DirectoryInUse,
        an OSError naming the holder, when another worker has it; `holder` adds this one's addresses to the
        lock's record), then sweep what a crashed run left."""
        settings.validate()
        self.settings = settings
        self.directory = Path(settings.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.lock = DirectoryLock.acquire(self.directory, holder)
        self._lock = threading.Lock()
        self._commit_pool: ThreadPoolExecutor | None = None  # a group commit's read-backs (`_start_each`)
        # early write-back only where a commit can tell what its sync still wrote (its rate evidence)
        self._writeback = _process_writeback() if _counts_unsynced(self.directory) else None
        if self._writeback is None:
            log.info("artifact store %s: no write-back while streaming (it needs sync_file_range and cachestat, "
                     "Linux 6.5 or later): each commit syncs its whole WAV", self.directory)
        self.space = SpaceKeeper(self)
        self._sweep_leftovers()

    def close(self) -> None:
        """Let the directory go (another store may open it); the process's end does the same."""
        self.lock.release()

    # ---- paths (only ever built from checked ids) ----
    def wav_path(self, artifact_id: str) -> Path:
        return self.directory / f"{check_artifact_id(artifact_id)}.wav"

    def sidecar_path(self, artifact_id: str) -> Path:
        return self.directory / f"{check_artifact_id(artifact_id)}.json"

    def _sidecar_temp_path(self, artifact_id: str) -> Path:
        """Where a sidecar is written before its rename into place (never served)."""
        return self.directory / f".{artifact_id}.json.partial"

    # ---- writing ----
    def begin(self, job_id: str, sample_rate: int, encoding: PcmEncoding) -> ArtifactWriter:
        """A writer for a new artifact; an unavailable one (no file) when the disk lacks its headroom."""
        return ArtifactWriter(self, new_artifact_id(), job_id, sample_rate, encoding,
                              unavailable=self.space.room_for_new_artifact())

    def status(self) -> StoreStatus:
        return self.space.status()

    def storage_fault(self, nbytes: int, *, write: bool) -> None:
        """Test-only fault injection: take as long as a volume writing (or reading) `nbytes` at
        fault_storage_write_bytes_per_s (fault_storage_read_bytes_per_s) would."""
        s = self.settings
        rate = s.fault_storage_write_bytes_per_s if write else s.fault_storage_read_bytes_per_s
        if rate > 0 and nbytes > 0:
            time.sleep(nbytes / rate)

    def commit_together(self, writers: list[ArtifactWriter]) -> list[ArtifactInfo | None]:
        """Commit finished artifacts as one group: every step as `ArtifactWriter.commit`, but each sync is
        shared (group commit). Per writer, in order: the committed info, or None when it was given up (its
        `unavailable_reason` says why; the others are unaffected).

        The steps: headers written; the WAVs synced, and meanwhile read back for their hashes; each renamed
        into place; the sidecars written; synced; renamed into place; the directory synced. An artifact
        exists for readers once its sidecar exists, so a reader never sees one whose WAV or sidecar is not on
        disk. A sync of several files is one `syncfs` of the artifact volume where the kernel reports
        write-back errors through it (Linux 5.8 and later), else, or when it fails, an fsync per file (which
        tells whose data failed).
        Why: the jobs of a batched step end together, and each one's final message waits for its commit;
        one at a time, the last job waits for every other job's syncs (the decision log in
        docs/performance.md has the figures). Each artifact's timing counts the group's steps in full (it
        waited for all of them): its storage time is the group's."""
        results: dict[ArtifactWriter, ArtifactInfo | None] = {}
        live = []
        for w in writers:
            if w._info is not None or w.unavailable_reason is not None:
                results[w] = w._info
            elif w._file is None:
                raise RuntimeError(f"artifact {w.artifact_id} was aborted")
            else:
                live.append(w)
        if live:
            for w, info in zip(live, self._commit_live(live)):
                results[w] = info
        return [results[w] for w in writers]

    def _commit_live(self, live: list[ArtifactWriter]) -> list[ArtifactInfo | None]:
        started_ns, clock = time.time_ns(), time.perf_counter_ns
        delay = self.settings.fault_commit_delay_s
        if delay > 0:  # test-only fault injection (diagnosis tests): a stall outside the storage calls
            time.sleep(delay)
        reading: list[Future] = []
        try:
            t0 = clock()
            sealed = [w for w in live if w._seal()]
            unsynced = {w: self._unsynced(w) for w in sealed}
            self.storage_fault(sum(unsynced.values()), write=True)
            # each sealed WAV is read back for its hash on the read-back threads while this thread syncs them
            # (the hash covers the bytes the file holds, which the sync does not change; hashlib lets go of
            # the interpreter while it hashes, and a 64-stream group reads back ~24 MB)
            reading = self._start_each(ArtifactWriter._digest, sealed)
            failed = dict(self._sync([(w, w._file) for w in sealed if w._file is not None]))
            t1 = clock()
            digests = self._finish_each(reading)
            reading = []
            t2 = clock()
            in_place = []
            for w, digest in zip(sealed, digests):
                failure = failed.get(w)
                if failure is None and isinstance(digest, OSError):
                    failure = digest
                if failure is not None:  # the disk failed its sync or its read-back: this artifact only
                    w._give_up(failure)
                    continue
                assert not isinstance(digest, OSError)
                if w._publish_wav():
                    in_place.append((w, digest))
            t3 = clock()
            # each artifact's steps are the group's, in full: it waited for every one of them
            published = [(w, (sha256, size, unsynced[w], t2 - t1, t3 - t2)) for w, (sha256, size) in in_place]
            infos = self._write_sidecars(published, started_ns, t1 - t0)
        except BaseException as exc:  # not a disk fault (those are per artifact): the whole group is off
            self._finish_each(reading, quietly=True)  # no read-back thread still reads a file removed below
            for w in live:
                if w._info is not None or w.unavailable_reason is not None:
                    continue
                if w._file is None:  # closed for its rename: its WAV may be in place already
                    w._unpublish(exc)
                else:
                    w.abort()
            raise
        for w, info in infos.items():
            w._committed(info)
        return [infos.get(w) for w in live]

    def _early_writeback(self) -> _WriteBack | None:
        """The write-back thread, when blocks are queued for write-back as they are written: not under the
        test-only write fault, which stands for a volume that writes everything at the sync."""
        return None if self.settings.fault_storage_write_bytes_per_s > 0 else self._writeback

    def _unsynced(self, w: ArtifactWriter) -> int:
        """Bytes of a sealed WAV its sync still has to write: with early write-back, the kernel's count of its
        pages not yet on the volume; else the whole file."""
        size = header_size(w.encoding) + w.data_bytes
        if self._early_writeback() is None or w._file is None:
            return size
        pending = unsynced_bytes(w._file.fileno(), size)
        return size if pending is None else pending

    def _write_sidecars(self, published: list, started_ns: int, wav_sync_ns: int) -> dict:
        """Write, sync and rename every published WAV's sidecar, then sync the directory; the infos of those
        whose sidecars made it (the others are unpublished and given up). The sidecar records the time just
        before it is written, and the steps before."""
        clock = time.perf_counter_ns
        t0 = clock()
        open_sidecars = []  # (writer, info, temp path, file, bytes)
        for w, (digest, size, unsynced, hash_ns, rename_ns) in published:
            timing = CommitTiming(started_at_ns=started_ns, bytes_synced=unsynced, wav_fsync_ns=wav_sync_ns,
                                  hash_ns=hash_ns, rename_ns=rename_ns)
            info = ArtifactInfo(artifact_id=w.artifact_id, size_bytes=size, sha256=digest, committed_at_ns=0,
                                commit=timing)
            record = {"artifact_id": w.artifact_id, "size_bytes": size, "sha256": digest,
                      "committed_at_ns": time.time_ns(), "job_id": w.job_id, "sample_rate": w.sample_rate,
                      "encoding": w.encoding.value, "commit": dataclasses.asdict(timing)}
            temp = self._sidecar_temp_path(w.artifact_id)
            try:
                f = open(temp, "w", encoding="utf-8")
            except OSError as exc:
                w._unpublish(exc)
                continue
            try:
                json.dump(record, f)
                f.flush()
                open_sidecars.append((w, info, temp, f, f.tell()))
            except OSError as exc:
                self._close_quietly(f)
                self._remove_quietly(temp)
                w._unpublish(exc)
        try:
            failed = dict(self._sync([(w, f) for w, _, _, f, _ in open_sidecars]))
        finally:
            for _, _, _, f, _ in open_sidecars:
                self._close_quietly(f)
        kept = []
        for w, info, temp, _, nbytes in open_sidecars:
            try:
                if w in failed:
                    raise failed[w]
                os.replace(temp, self.sidecar_path(w.artifact_id))
            except OSError as exc:
                self._remove_quietly(temp)
                w._unpublish(exc)
                continue
            kept.append((w, info, nbytes))
        t1 = clock()
        if kept:
            try:
                _fsync_dir(self.directory)
            except OSError as exc:
                for w, _, _ in kept:
                    w._unpublish(exc)
                return {}
        t2 = clock()
        infos = {}
        for w, info, nbytes in kept:
            assert info.commit is not None  # set above
            commit = dataclasses.replace(info.commit, bytes_synced=info.commit.bytes_synced + nbytes,
                                         sidecar_fsync_ns=t1 - t0, dir_fsync_ns=t2 - t1)
            infos[w] = ArtifactInfo(info.artifact_id, info.size_bytes, info.sha256, time.time_ns(), commit)
        return infos

    def _start_each(self, fn, items: list) -> list[Future]:
        """fn(item) for each item, started on the store's read-back threads; `_finish_each` waits for them."""
        with self._lock:
            if self._commit_pool is None:
                self._commit_pool = ThreadPoolExecutor(max_workers=COMMIT_READERS,
                                                       thread_name_prefix="artifact-commit")
        return [self._commit_pool.submit(fn, item) for item in items]

    @staticmethod
    def _finish_each(futures: list[Future], quietly: bool = False) -> list:
        """The results of `_start_each`'s calls, in order, once all are done; the first exception raised is
        raised here (not when `quietly`: then only the waiting is wanted)."""
        wait(futures)
        return [] if quietly else [f.result() for f in futures]

    def _sync(self, files: list[tuple[_Owner, IO[Any]]]) -> list[tuple[_Owner, OSError]]:
        """Make the files' written data durable: one syncfs for several, else an fsync each; the (owner,
        error) of each file that failed."""
        if len(files) > 1 and _syncfs(files[0][1].fileno()):
            return []
        failed = []
        for owner, f in files:
            try:
                os.fsync(f.fileno())
            except OSError as exc:
                failed.append((owner, exc))
        return failed

    @staticmethod
    def _close_quietly(f) -> None:
        try:
            f.close()
        except OSError:
            pass

    # ---- reading ----
    def _read_sidecar(self, artifact_id: str) -> dict:
        path = self.sidecar_path(artifact_id)  # checks the id first
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            raise NotFound(f"artifact {artifact_id} does not exist on this worker (it may have expired: "
                           f"retention keeps artifacts {self.settings.max_age_s:.0f} s)") from None

    def stat(self, artifact_id: str) -> ArtifactInfo:
        record = self._read_sidecar(artifact_id)
        commit = record.get("commit")
        return ArtifactInfo(record["artifact_id"], int(record["size_bytes"]), record["sha256"],
                            int(record["committed_at_ns"]),
                            CommitTiming(**commit) if isinstance(commit, dict) else None)

    def describe(self, artifact_id: str) -> dict:
        """The whole sidecar record (job id, sample rate, encoding besides the ArtifactInfo fields)."""
        return self._read_sidecar(artifact_id)

    def open_for_read(self, artifact_id: str) -> tuple[BinaryIO, ArtifactInfo]:
        info = self.stat(artifact_id)
        try:
            f = open(self.wav_path(artifact_id), "rb")
        except FileNotFoundError:
            raise NotFound(f"artifact {artifact_id} does not exist on this worker") from None
        if os.fstat(f.fileno()).st_size != info.size_bytes:
            f.close()
            raise NotFound(f"artifact {artifact_id} is damaged on the worker (size mismatch); synthesize again")
        return f, info

    def list_ids(self) -> list[str]:
        return sorted(p.stem for p in self.directory.glob("art-*.json")
                      if ARTIFACT_ID_PATTERN.fullmatch(p.stem))

    def committed_records(self) -> list[dict]:
        """Every committed artifact's sidecar record, oldest commit first (unreadable ones skipped)."""
        records = []
        for artifact_id in self.list_ids():
            try:
                record = self.describe(artifact_id)
                int(record["committed_at_ns"]), int(record["size_bytes"])
            except (NotFound, ValueError, KeyError, TypeError, OSError):
                continue
            records.append(record)
        records.sort(key=lambda r: int(r["committed_at_ns"]))
        return records

    # ---- deleting ----
    def delete(self, artifact_id: str) -> None:
        sidecar = self.sidecar_path(artifact_id)
        with self._lock:
            if not sidecar.exists():
                raise NotFound(f"artifact {artifact_id} does not exist on this worker")
            self._remove_quietly(sidecar)  # readers lose sight of it first
            self._remove_quietly(self.wav_path(artifact_id))
        log.info("artifact %s deleted", artifact_id)

    def discard(self, artifact_id: str) -> bool:
        """Delete an artifact if it is still there; True when this call deleted it."""
        try:
            self.delete(artifact_id)
            return True
        except NotFound:
            return False

    def enforce_retention(self) -> list[str]:
        """Delete artifacts older than max_age_s, then the oldest beyond max_total_bytes; returns their ids."""
        now = time.time_ns()
        max_age_ns = int(self.settings.max_age_s * 1e9)
        records = self.committed_records()
        doomed = [r for r in records if now - int(r["committed_at_ns"]) > max_age_ns]
        kept = [r for r in records if r not in doomed]
        total = sum(int(r["size_bytes"]) for r in kept)
        while kept and total > self.settings.max_total_bytes:
            oldest = kept.pop(0)
            total -= int(oldest["size_bytes"])
            doomed.append(oldest)
        deleted = []
        for r in doomed:
            try:
                self.delete(r["artifact_id"])
                deleted.append(r["artifact_id"])
            except NotFound:
                pass
        self._remove_stale_files(now)
        if deleted:
            log.info("retention deleted %d artifacts (%d bytes kept)", len(deleted), total)
        return deleted

    def _remove_stale_files(self, now_ns: int) -> None:
        """Partial files older than max_age_s and WAVs whose sidecar never appeared (crash mid-commit)."""
        for path in self.directory.iterdir():
            name = path.name
            try:
                age_s = (now_ns - path.stat().st_mtime_ns) / 1e9
            except FileNotFoundError:
                continue
            if name.startswith(".art-") and name.endswith(".partial") and age_s > self.settings.max_age_s:
                self._remove_quietly(path)
            elif (name.endswith(".wav") and ARTIFACT_ID_PATTERN.fullmatch(name[:-4])
                  and not (self.directory / f"{name[:-4]}.json").exists() and age_s > _ORPHAN_GRACE_S):
                self._remove_quietly(path)

    def _sweep_leftovers(self) -> None:
        """At start-up no artifact is being written: every temp file and every WAV without a sidecar is what a
        crashed or killed run left behind (the directory's lock, taken before, keeps every other worker out)."""
        removed = 0
        for path in self.directory.iterdir():
            name = path.name
            stem = name[:-4] if name.endswith(".wav") else ""
            if ((name.startswith(".art-") and name.endswith(".partial"))
                    or (ARTIFACT_ID_PATTERN.fullmatch(stem) and not (self.directory / f"{stem}.json").exists())):
                self._remove_quietly(path)
                removed += 1
        if removed:
            log.warning("removed %d unfinished artifact file(s) left in %s by a previous run that stopped "
                        "mid-write", removed, self.directory)

    @staticmethod
    def _remove_quietly(path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a failing disk: the start-up sweep or retention retries later
            log.warning("could not remove %s: %s", path, exc)
