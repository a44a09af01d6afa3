"""The Qwen3-TTS-Tokenizer-12Hz codec: decoder (codes -> 24 kHz PCM) and encoder (reference audio -> codes)."""
