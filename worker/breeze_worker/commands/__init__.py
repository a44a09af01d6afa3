"""Subcommands of `breeze-worker`, one module each (`add_arguments(parser)`, `run(args) -> int`)."""
