"""Sparse matrices on the GPU: formats (``CSR``, ``COO``, ``BSR``), products (``spmv``,
``spmm``, ``sddmm``, ``bsr_mm``), reverse Cuthill-McKee reordering (``rcm``) and matrix
generators (``tritonkit.sparse.generate``).

See docs/sparse.md for the formats, the load-balancing rule and the configs.
"""

from __future__ import annotations

import importlib

from tritonkit.ops.sparse import BSR, COO, CSR, bsr_mm, sddmm, spmm, spmv

_LAZY = {"rcm": "reorder", "bandwidth": "reorder", "permute": "reorder", "generate": None}
__all__ = ["BSR", "COO", "CSR", "bsr_mm", "sddmm", "spmm", "spmv", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"tritonkit.sparse.{_LAZY[name] or name}")
        value = module if _LAZY[name] is None else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tritonkit.sparse' has no attribute {name!r}")
