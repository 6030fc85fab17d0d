"""A running SGLang engine, from the outside: HTTP client, Prometheus metrics, what it reports about itself.

Shared by the GPU tier (``difflab.gpu``), the deployment preflight (``difflab.preflight``)
and the test server (``difflab.testing``); it depends on none of them. ``names`` is the
one table of engine-side names (endpoints, metrics, flags, environment variables).
"""
