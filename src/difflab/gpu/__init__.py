"""The GPU/RDMA integration tier: real 1-prefill/1-decode deployments, judged like the CPU probes.

Layout (one job per module): ``scenarios/`` drive the deployments (:mod:`difflab.stats`,
shared with the CPU tier, compares their throughput samples), ``bench`` runs or parses
load, ``images``/``deployment``/``host`` start real containers, ``targets`` is the one
interface over a Docker deployment and the CPU test server
(:mod:`difflab.testing.testserver`), ``verdicts``/``report`` turn the A/B into a
verdict and a summary section. The engine client, metrics and facts live in
:mod:`difflab.engine`; which scenario judges which fix is in the matrix
(:mod:`difflab.matrix.gpu`); :mod:`difflab.workflows.gpu` ties a run together.
"""
