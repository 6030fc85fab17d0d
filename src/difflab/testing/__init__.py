"""Test infrastructure the lab ships, as pytest ships ``pytester``: stand-ins that run on a CPU.

``testserver`` is an SGLang-compatible 1P1D deployment whose pre-fix behaviours can be
switched on, so ``difflab gpu --testserver`` proves the GPU tier's logic without GPUs.
"""
