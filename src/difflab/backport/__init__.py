"""Backport checks: does a fork's ref behave like a fix's head? (``difflab backport``)."""
