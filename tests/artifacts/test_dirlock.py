"""The artifact directory's lock (artifacts/dirlock.py) within one process: a second store on a held directory
is refused before it touches anything there, naming the directory and the holder; `close` lets it go with an
empty record, so the next store takes it without calling anyone dead. Between real worker processes (SIGSTOP,
kill -9): tests/reliability/test_one_worker_per_directory.py."""

from __future__ import annotations

import json
import logging
import os

import pytest

from breeze_worker.artifacts.dirlock import LOCK_NAME, DirectoryInUse
from breeze_worker.artifacts.store import ArtifactStore
from breeze_worker.config import ArtifactSettings
from breeze_worker.engine.types import PcmEncoding


def _store(directory, **holder) -> ArtifactStore:
    return ArtifactStore(ArtifactSettings(directory=directory, min_free_bytes=0), holder=holder or None)


def test_a_second_store_on_a_held_directory_is_refused_and_touches_nothing(tmp_path):
    first = _store(tmp_path, synthesis="127.0.0.1:50051", artifacts="127.0.0.1:50052")
    writing = first.begin("job-1", 24000, PcmEncoding.S16LE)
    writing.append(b"\1\0" * 100)
    partial = tmp_path / f".{writing.artifact_id}.partial"
    assert partial.exists()
    with pytest.raises(DirectoryInUse) as refused:
        _store(tmp_path)
    message = str(refused.value)
    assert f"the artifact directory {tmp_path} is in use by another worker (pid {os.getpid()} on host" in message
    assert "synthesis 127.0.0.1:50051, artifacts 127.0.0.1:50052" in message and "--artifact-dir" in message
    assert partial.exists()  # the refused store never swept
    assert writing.commit() is not None


def test_the_record_names_the_holder_and_close_empties_it(tmp_path, caplog):
    store = _store(tmp_path, synthesis="127.0.0.1:1")
    store.lock.update(metrics="127.0.0.1:9")
    record = json.loads((tmp_path / LOCK_NAME).read_text())
    assert record["pid"] == os.getpid() and record["synthesis"] == "127.0.0.1:1" and record["metrics"] == "127.0.0.1:9"
    store.close()
    assert (tmp_path / LOCK_NAME).read_text() == ""
    with caplog.at_level(logging.INFO, logger="breeze_worker.artifacts.dirlock"):
        _store(tmp_path).close()  # free: taken without a word about a previous holder
    assert "ended without releasing" not in caplog.text


def test_a_lock_file_left_with_a_record_is_taken_over_with_a_note(tmp_path, caplog):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 4242, "host": "gone", "synthesis": "10.0.0.1:50051"}))
    with caplog.at_level(logging.INFO, logger="breeze_worker.artifacts.dirlock"):
        store = _store(tmp_path)  # the file is there, but nobody holds its lock: its holder died
    assert "the previous worker (pid 4242 on host gone, synthesis 10.0.0.1:50051) ended without releasing it" \
        in caplog.text
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    store.close()
