"""Workflows: one module per command, each composed of the step packages below it.

A workflow reads a request, runs the steps (matrix → source → environment → runner →
diff → report → bundle) in its own order, and writes one run folder. Step packages
never import a workflow; commands call exactly one.
"""
