"""The gRPC edge: servicers, status mapping, auth, health. Converts pb <-> engine types and nothing more."""
