"""The throughput probes, one module per fix (``run --throughput``); shipped as ``difflab.probes.throughput``."""
