"""Optimizer family: the kernels and launchers behind ``tritonkit.optim``.

``kernels_adam`` (the multi-tensor Adam/AdamW step), ``kernels_nonfinite`` (the gradient check
that runs before a step), ``kernels_clip`` (the global norm), ``kernels_muon`` (Muon's momentum,
normalization and update), ``kernels_newton_schulz`` (the batched Newton-Schulz GEMMs, symmetric
products on one triangle) and ``kernels`` (device helpers); ``config`` (the chunks and tiles),
``plan`` (the multi-tensor table and the launchers), ``function`` (the functional forms,
public as ``tritonkit.optim.functional``).
"""
