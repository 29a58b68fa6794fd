"""Kernel families, one package each (``ops/<family>/``), and what they share (``ops/_core/``).

``FAMILIES`` is the one list of families whose public functions tritonkit exports: each
family's ``__all__`` names them, and ``tritonkit.__all__`` and ``tritonkit.functional`` are
derived from it. A new family adds its name here (``tritonkit new`` does it).
"""

FAMILIES: tuple[str, ...] = (
    "elementwise",
    "memory",
    "matmul",
    "norm",
    "softmax",
    "cross_entropy",
    "attention",
    "rope",
    "conv",
)
