"""Typed errors: each carries the exit code the CLI returns for it."""

from __future__ import annotations


class DifflabError(Exception):
    """Base class; the message is shown to the user as is."""

    exit_code = 2


class ConfigError(DifflabError):
    """Bad input: a malformed matrix, an unknown fix, a bad flag (exit 2)."""


class SourceError(DifflabError):
    """A pinned source cannot be had: unreachable repository, missing commit, hash mismatch (exit 2)."""


class EnvironmentSetupError(DifflabError):
    """The shared environment could not be created (exit 2)."""


class VerificationFailed(DifflabError):
    """Evidence does not check out: tampered bundle, bad signature (exit 1)."""

    exit_code = 1
