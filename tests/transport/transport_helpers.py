"""Helpers for transport tests (imported by name; conftest modules are not importable across test dirs)."""

from __future__ import annotations

from breeze_worker.config import ArtifactSettings, ServerSettings, WorkerSettings


def worker_settings(tmp_path, **server) -> WorkerSettings:
    return WorkerSettings(artifacts=ArtifactSettings(directory=tmp_path / "artifacts"),
                          server=ServerSettings(port=0, artifact_port=0, **server))
