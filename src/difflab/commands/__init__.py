"""Subcommands of ``difflab``: one module each (see :mod:`difflab.cli`)."""
