"""Breeze TTS 2 worker: transport (gRPC) -> engine (sessions, scheduler, fast path) -> model and artifact store."""

__version__ = "0.1.0"
