"""Functional forms of the optimizer kernels, on single tensors (the workbench's view of them):
``adam_step`` and ``newton_schulz``, kept in the optimizer family (``ops/optim/function.py``)."""

from tritonkit.ops.optim.function import adam_step, newton_schulz

__all__ = ["adam_step", "newton_schulz"]
