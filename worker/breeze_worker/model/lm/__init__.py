"""The Breeze TTS 2 language model: text encoder, backbone, depth decoder."""
