"""Subcommands of `breeze-client`, one module each (`add_arguments(parser)`, `run(args, options) -> int`)."""
