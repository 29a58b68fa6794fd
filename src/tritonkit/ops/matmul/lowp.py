"""FP8 and INT8 GEMMs: ``(a @ b) * scale_a * scale_b + bias`` with 8-bit operands, fp32 (FP8)
or int32 (INT8) accumulation, on the persistent kernel (``persistent.py``); FP8 partial sums are
promoted to fp32 as ``configs.promotion`` says.

Hopper's wgmma reads 8-bit operands from shared memory K-major only: A row-major and B
column-major (B^T row-major, as nn.Linear's (N, K) weight). Any other layout cannot use the TMA
path (``plan.tma_ok``) and runs the pointer loop, several times slower (INT8 with B row-major,
the natural ``a @ b``, against B K-major; see docs/performance.md). So from
``GemmOptions.kmajor_copy_min_mnk`` on, the launcher first transposes such an operand into a
K-major scratch buffer with the tiled transpose (``memory.transpose_fwd``: coalesced reads and
writes), then runs the TMA path. The scratch is allocated per call and freed when it returns:
K * N extra bytes for B, M * K for A (one byte per element), and twice that in memory traffic,
small beside the GEMM's 2 * M * N * K operations once the problem is large. Each copy is
counted in LAYOUT_COPIES, so reports show it; ``kmajor_copies`` says beforehand which operands
a call copies. Below the threshold (and for skinny problems, which take split-K's pointer loop
anyway) the extra launch may cost more than it saves. In experiments/sweep_lowp.py (INT8 with
b row-major) the copy route beat the pointer loop at every size timed, the more so the larger
the problem; smaller problems were not timed, so the copy starts at 512^3 (see
docs/performance.md).
"""

from __future__ import annotations

import torch

from tritonkit.ops._core.device import sm_count
from tritonkit.ops._core.gemm import Epilogue, Problem, matrix, tma_orientation
from tritonkit.ops._core.plan import cached
from tritonkit.ops.matmul.configs import GEMM_OPTIONS, GemmOptions, MatmulConfig
from tritonkit.ops.matmul.plan import as_is, build_plan, signature, tma_device
from tritonkit.ops.matmul.splitk import split_k_for
from tritonkit.ops.memory import transpose_fwd


def _kmajor_plan(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype,
    force: bool | None,
    config: MatmulConfig | None,
    options: GemmOptions,
) -> tuple[bool, bool]:
    """(copy a, copy b) for the 8-bit GEMM ``a @ b``: see the module docstring."""
    if a.element_size() != 1 or force is False or not tma_device(a.device, options):
        return False, False
    m, k = a.shape
    n = b.shape[1]
    copy_a = not tma_orientation(a, row_major=True)
    copy_b = not tma_orientation(b, row_major=False)
    # The copies have K-byte rows and TMA needs 16-byte aligned strides, for the output too;
    # tiny problems never take the TMA path.
    tma_after = min(m, n, k) >= 16 and k % 16 == 0 and (n * out_dtype.itemsize) % 16 == 0
    if not (copy_a or copy_b) or not tma_after:
        return False, False
    if force is None:
        if config is None and m <= options.decode_max_m:
            return False, False  # the decode kernel reads any layout in place
        if config is not None and (not config.tma or config.SPLIT_K > 1):
            return False, False  # a forced pointer-path config would not read the copies
        if m * n * k < options.kmajor_copy_min_mnk:
            return False, False
        sms = options.sms or sm_count(a.device)
        if split_k_for(m, n, k, 1, sms) > 1:
            return False, False
    return copy_a, copy_b


def kmajor_copies(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype = torch.int32,
    options: GemmOptions = GEMM_OPTIONS,
) -> tuple[bool, bool]:
    """Which operands ``scaled_matmul`` / ``int8_matmul`` first copy into K-major scratch.

    Returns ``(copy_a, copy_b)``: True for an 8-bit operand that is not stored K-major (a
    row-major, b column-major) when TMA is available and the problem is large enough for the
    copy to pay; the copy of b costs ``K * N`` extra bytes per call, of a ``M * K``.
    """
    return _kmajor_plan(a, b, out_dtype, None, None, options)


def _vector_scale(scale: torch.Tensor | None) -> tuple[torch.Tensor | None, bool]:
    """A scale as a 1-D view (per row / per column) or as-is (one value)."""
    if scale is None or scale.numel() == 1:
        return scale, False
    return scale.reshape(-1), True


def _kmajor_a(a: torch.Tensor) -> torch.Tensor:
    return transpose_fwd(a.t())  # (M, K), row-major


def _kmajor_b(b: torch.Tensor) -> torch.Tensor:
    return transpose_fwd(b).t()  # (K, N) view of an (N, K) row-major scratch buffer


class ScaledPlan:
    """``scaled_matmul_fwd``'s plan: the output's shape and the GEMM (copies included)."""

    __slots__ = ("gemm", "shape")

    def __init__(self, shape: tuple[int, int], gemm) -> None:
        self.shape, self.gemm = shape, gemm

    @property
    def copies(self) -> tuple[bool, bool]:
        """(a copied, b copied) K-major per call."""
        return tuple(c == "kmajor" for c in self.gemm.copies) if self.gemm else (False, False)

    def run(self, a, b, scale_a, scale_b, bias, out_dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=out_dtype, device=a.device)
        gemm = self.gemm
        if gemm is not None:
            a, b = gemm.operands(a, b)
            sa, sb = _vector_scale(scale_a)[0], _vector_scale(scale_b)[0]
            gemm.launch(a, b, out, (sa, sb, bias, None, None))
        return out


def scaled_matmul_plan(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None,
    scale_b: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: MatmulConfig | None = None,
    kmajor: bool | None = None,
    options: GemmOptions = GEMM_OPTIONS,
) -> ScaledPlan:
    """The plan ``scaled_matmul_fwd`` runs for these inputs (cached; built now if new)."""
    key = (
        signature(a), signature(b), signature(scale_a), signature(scale_b), signature(bias),
        out_dtype, a.device, config, kmajor, options,
    )  # fmt: skip

    def build() -> ScaledPlan:
        m, k = a.shape
        n = b.shape[1]
        if m == 0 or n == 0:
            return ScaledPlan((m, n), None)
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
        copy_a, copy_b = _kmajor_plan(a, b, out_dtype, kmajor, config, options)
        a_k = _kmajor_a(a) if copy_a else a
        b_k = _kmajor_b(b) if copy_b else b
        sa, rows = _vector_scale(scale_a)
        sb, cols = _vector_scale(scale_b)
        epi = Epilogue(scale_a=sa, scale_a_rows=rows, scale_b=sb, scale_b_cols=cols, bias=bias)
        p = Problem(matrix(a_k), matrix(b_k), matrix(out), m, n, k)
        gemm = build_plan(
            p, epi, "best", config, options,
            prep_a=_kmajor_a if copy_a else as_is,
            prep_b=_kmajor_b if copy_b else as_is,
            copies=("kmajor" if copy_a else None, "kmajor" if copy_b else None),
        )  # fmt: skip
        return ScaledPlan((m, n), gemm)

    return cached("scaled_matmul.plan", key, build)


def scaled_matmul_fwd(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None,
    scale_b: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: MatmulConfig | None = None,
    kmajor: bool | None = None,
    options: GemmOptions = GEMM_OPTIONS,
) -> torch.Tensor:
    """``(a @ b) * scale_a * scale_b + bias`` for 2-D 8-bit a and b (FP8 or INT8).

    ``config`` forces one launch config; ``kmajor`` forces (True: whatever the size, wherever
    TMA could read the copies) or forbids (False) the K-major scratch copies of operands wgmma
    cannot read as stored, which by default (None) are made from
    ``options.kmajor_copy_min_mnk`` on (tests and sweeps).
    """
    plan = scaled_matmul_plan(a, b, scale_a, scale_b, bias, out_dtype, config, kmajor, options)
    return plan.run(a, b, scale_a, scale_b, bias, out_dtype)
