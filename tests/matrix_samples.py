"""Small matrix texts shared by tests."""

RELEASES = """
schema = 1
[releases."0.5.20"]
file = "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl"
sha256 = "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c"
[releases."0.5.21"]
file = "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl"
sha256 = "96c029f75dec99baa33a5db3d41b1bebefdd6bcfba3a2f7c807fe1cf49a87c20"
"""

FIX = """
[[fixes]]
id = "38935"
pr = 38935
title = "t"
base = { release = "0.5.20" }
head = { release = "0.5.21" }
[[fixes.probes]]
name = "pr38935_prefill_door"
[fixes.probes.expect]
"rejected.enqueued" = [true, false]
[fixes.probes.controls]
"valid.enqueued" = true
"""
