"""Sparse matrices: CSR / COO / BSR formats and their kernels (SpMV, SpMM, SDDMM, BSR x dense).

The public package is ``tritonkit.sparse``; this family exports no flat functions of its own.
"""

from tritonkit.ops.sparse.api import SpmmFunction, SpmvFunction, bsr_mm, sddmm, spmm, spmv
from tritonkit.ops.sparse.config import (
    ROWS,
    SPLIT,
    BsrConfig,
    SddmmConfig,
    SpmmConfig,
    SpmvConfig,
    strategy,
)
from tritonkit.ops.sparse.formats import BSR, COO, CSR

__all__: list[str] = []
