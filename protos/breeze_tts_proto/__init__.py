"""Generated gRPC stubs for the Breeze TTS worker contract (package breeze.tts.v1). Do not edit the *_pb2 files."""
