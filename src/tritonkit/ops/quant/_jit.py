"""The quant family's device helpers now live in ops/_core/quant_codes.py, shared with the
compressed collectives (ops/collectives); re-exported here for the family's kernels."""

from tritonkit.ops._core.quant_codes import (  # noqa: F401
    asymmetric_scales,
    encode,
    finite_abs,
    finite_or,
    pack_int4,
    rne,
    symmetric_scales,
)
