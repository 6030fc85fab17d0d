"""The GPU/RDMA integration tier: real 1-prefill/1-decode deployments, judged like the CPU probes.

Layout (one job per module): ``client`` speaks SGLang's HTTP endpoints, ``metrics``
reads Prometheus text, ``facts`` resolves what an engine reports about itself across
versions, ``scenarios/`` drive the deployments, ``stats`` compares throughput samples,
``bench`` runs or parses load, ``images``/``deployment``/``host`` start real containers,
``testserver/`` is an SGLang-compatible stand-in that reproduces the pre-fix behaviours
on a CPU, and ``tier`` ties a run together into the usual run folder.
"""
