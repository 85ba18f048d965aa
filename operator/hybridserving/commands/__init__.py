"""Subcommands of the `hybridserving` CLI, one module each exposing `register(subparsers)`."""
