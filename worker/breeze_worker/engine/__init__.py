"""The engine: request semantics, sessions, the scheduler and the decode paths. Imports no gRPC."""
