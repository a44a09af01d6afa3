"""The Breeze TTS 2 model: language model, codec, checkpoint loader and the tiny embedded default."""
