"""The behaviour probes, one module per fix (``pr<PR>_<what>.py``); shipped as ``difflab.probes``.

A probe process imports its probe from this folder's file, with the folder on ``sys.path``
(``harness`` is imported as a top-level package), so nothing imports this package by name: it
marks the folder as the package data the lab reads through ``importlib.resources``.
"""
