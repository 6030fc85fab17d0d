"""The in-environment package: everything that runs inside the shared SGLang environment.

Standard library only (that environment holds SGLang's dependencies and nothing of the
lab's), and copied there as a unit (:mod:`difflab.runner.childlib`). The process boundary
is this package's edge: the lab starts these modules, talks to them through files and
JSON lines, and imports from them only constants and types.

- ``kit``: what a probe sees (strict fakes, recorders, log capture);
- ``child``: one probe in a fresh process (``python -m difflab.probe.child``);
- ``hub``, ``source_server``, ``process``: the warm back end's hub → server → probe fork
  tree (``python -m difflab.probe.hub``) and the fd/signal plumbing under it;
- ``stubs``: stand-ins for the GPU-only packages SGLang imports;
- ``upstream_child``: SGLang's own test files, for the upstream-test replay (``upstream_facts``:
  what a failure says about itself; ``upstream_pytest``: the plugin for pytest-style files).
"""
