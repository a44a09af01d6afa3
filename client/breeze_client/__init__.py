"""Client SDK and CLI for the Breeze TTS 2 worker."""

__version__ = "0.1.0"
