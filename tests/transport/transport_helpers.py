"""Helpers for transport tests (imported by name; conftest modules are not importable across test dirs)."""

from __future__ import annotations

from breeze_worker.config import ArtifactSettings, ServerSettings, WorkerSettings

TOKEN = "a-test-token-0123456789"  # the bearer token of the tests that set one (16 characters at least)


def worker_settings(tmp_path, **server) -> WorkerSettings:
    return WorkerSettings(artifacts=ArtifactSettings(directory=tmp_path / "artifacts"),
                          server=ServerSettings(port=0, artifact_port=0, **server))
