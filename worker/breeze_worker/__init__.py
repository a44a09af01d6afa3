"""Breeze TTS 2 worker: transport (gRPC) -> engine (sessions, scheduler, fast path) -> model and artifact store."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("breeze-tts-serving")
except PackageNotFoundError:  # imported from a source tree that was never installed (the device runs)
    __version__ = "0+unknown"
