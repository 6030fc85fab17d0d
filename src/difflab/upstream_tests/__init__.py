"""Upstream test replay: a fix's own SGLang unit tests at base and head, as supporting evidence."""

from difflab.upstream_tests.replay import FixReplay, replay_fix, replay_run

__all__ = ["FixReplay", "replay_fix", "replay_run"]
