"""Helpers shared by the probes: just enough set-up to drive real SGLang objects on a CPU.

- :mod:`harness.runtime`: process-wide state a real ``Req`` and scheduler need
  (published config, tensor-parallel rank 0), bare instances of real classes,
  scenario-scoped swaps of module globals, the cache-abort API of the release.
- :mod:`harness.requests`: real ``Req`` objects in the states the probes need
  (rejected at intake, aborted while running, holding KV or a metadata slot).
- :mod:`harness.features`: the machinery a fix modifies; a release without it is
  ``n/a`` (not applicable), never an error.

Modules here import SGLang lazily, inside functions, so a probe decides when
the (slow) SGLang import happens. Their public functions are a stable API for
every probe in ``probes/``.
"""
