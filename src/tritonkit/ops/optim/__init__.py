"""Optimizer family: the kernels and launchers behind ``tritonkit.optim``.

``adam`` (the multi-tensor Adam/AdamW step), ``nonfinite`` (the gradient check that runs
before a step), ``muon`` (Muon's momentum, normalization and update), ``newton_schulz`` (the
batched Newton-Schulz GEMMs, symmetric products on one triangle), ``tables`` (the multi-tensor
layout they share) and ``math`` (device helpers).
"""
