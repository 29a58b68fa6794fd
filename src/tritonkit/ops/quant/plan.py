"""The quant family's launchers and plans: from a block shape (how many elements share one scale
along each dimension) to the kernel path that moves the fewest bytes; dequantize; the
weight-only int8 GEMM.

Paths, by which elements share a scale:

- groups of G consecutive elements of the last dimension (per row when G is the row):
  one pass (kernels_groups.py), or amax pass + cast pass when G exceeds one program
  (kernels_twopass.py);
- groups of k along another dimension: one pass (kernels_strided.py) for k up to 512;
- a whole column (per channel), groups of channels, the whole tensor: an amax pass with
  atomics, then the cast pass (kernels_twopass.py): two reads, the fewest for a scale that
  depends on elements other programs read; except a small tensor with one scale (a decode
  step's activations): one launch in which every program reads all of it (kernels_small.py).

A scale given by the caller (static, delayed or EMA scaling) needs no amax pass: the cast pass
alone, which can return the amax of what it cast (``quantize_with_scale``).

Weight-only int8 linear: ``y = (x @ W_int8^T) * scale + bias`` with the int8 weight read as
stored (half the bytes of a bf16 weight) and widened in registers, by the tiled kernel
(kernels_weight_only.py) at every M, decode sizes too, with split-K where the tiles are too few
and the fp32 partial products summed in a fixed order (``sum_partials``). A call's plan
(``weight_only_plan``) is cached per input signature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tritonkit import _tuning
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.launch import Bound
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, next_power_of_2
from tritonkit.ops._core.plan import PLANS, cached
from tritonkit.ops._core.reduce import sum_partials
from tritonkit.ops.matmul.plan import signature
from tritonkit.ops.quant.config import (
    AMAX_ITERS,
    FORMATS,
    MAX_GROUP,
    MIN_BLOCK_I,
    ROW_MAJOR_TILES,
    SMALL_TENSOR,
    TRANSPOSING_TILES,
    GroupsConfig,
    QFormat,
    SmallTensorConfig,
    StridedConfig,
    TwoPassConfig,
    WeightOnlyConfig,
    _candidates,
    default_config,
    default_groups_config,
    empty_group_scale,
    fits_one_pass,
)
from tritonkit.ops.quant.kernels_dequant import _dequant_kernel
from tritonkit.ops.quant.kernels_groups import _quant_groups_kernel
from tritonkit.ops.quant.kernels_small import _quant_tensor_small_kernel
from tritonkit.ops.quant.kernels_strided import _quant_strided_kernel
from tritonkit.ops.quant.kernels_twopass import (
    COLS,
    FROM_AMAX,
    GIVEN_QSCALE,
    GIVEN_SCALE,
    ROWS,
    TENSOR,
    _amax_kernel,
    _cast_kernel,
)
from tritonkit.ops.quant.kernels_weight_only import _wo_int8_kernel

_FP8_NAN = {torch.float8_e4m3fn: 0x7F, torch.float8_e5m2: 0x7D}


def dequantize_2d(
    q2: torch.Tensor,
    scale: torch.Tensor,
    zp: torch.Tensor | None,
    out2: torch.Tensor,
    rows_per_scale: int,
    cols_per_scale: int,
    packed: bool,
    stride_sr: int | None = None,
) -> None:
    """Launch over ``out2`` (n_rows, n_cols); ``q2`` holds its codes (packed: half the columns);
    ``scale``'s rows are ``stride_sr`` apart (None: contiguous)."""
    n_rows, n_cols = out2.shape
    if out2.numel() == 0:
        return
    # 4096 elements a program; fewer rows than 16 (the collectives' (world, shard) views) take
    # wider column tiles rather than masked rows.
    block_r = min(16, next_power_of_2(n_rows))
    block_c = 4096 // block_r
    grid = (cdiv(n_rows, block_r), cdiv(n_cols, block_c))
    _dequant_kernel[grid](
        q2, scale, zp, out2, n_rows, n_cols, *q2.stride(), *out2.stride(),
        rows_per_scale, cols_per_scale,
        cdiv(n_cols, cols_per_scale) if stride_sr is None else stride_sr,
        HAS_ZP=zp is not None, PACKED=packed,
        FP8_NAN=_FP8_NAN.get(q2.dtype, 0) if interpreter_enabled() else 0,
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4,
    )  # fmt: skip


def quantize_groups(
    x2: torch.Tensor,
    stride_xr: int,
    q: torch.Tensor,
    stride_qr: int,
    scale: torch.Tensor,
    zp: torch.Tensor | None,
    amax: torch.Tensor | None,
    group: int,
    fmt: QFormat,
    pow2: bool,
    emulate: bool,
    config: GroupsConfig | None = None,
) -> None:
    """Launch over ``x2``: (n_rows, n_cols) rows ``stride_xr`` apart, groups of ``group``."""
    n_rows, n_cols = x2.shape
    n_groups = n_rows * (n_cols // group)
    if n_groups == 0:
        return
    cfg = config or default_groups_config(group)
    key = (
        x2.shape, stride_xr, x2.dtype, q.dtype, stride_qr, x2.device, zp is None, amax is None,
        group, fmt, pow2, emulate, cfg,
    )  # fmt: skip

    def bind() -> Bound:
        g_p2 = next_power_of_2(group)
        block_g = cfg.block_groups(g_p2)
        return _quant_groups_kernel.bind(
            (cdiv(n_groups, block_g),), x2, q, scale, zp, amax, n_groups, n_cols // group,
            stride_xr, stride_qr, QMIN=fmt.qmin, QMAX=fmt.qmax, MANT=fmt.mantissa,
            EMIN=fmt.emin, G=group, G_P2=g_p2, BLOCK_G=block_g, IS_FLOAT=fmt.is_float,
            ASYM=not fmt.symmetric, POW2=pow2, PACK=fmt.packed, RETURN_AMAX=amax is not None,
            EMULATE=emulate, num_warps=cfg.num_warps,
        )  # fmt: skip

    # Bound once per signature: a repeated call (a decode step's activations) skips Triton's
    # binder and passes only its tensors.
    launch = PLANS.get(("quant.groups", key), None, bind)  # no setting of the Env changes it
    launch(*(t for t in (x2, q, scale, zp, amax) if t is not None))


def quantize_tensor_small(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor | None,
    fmt: QFormat,
    pow2: bool,
    emulate: bool,
    config: SmallTensorConfig = SMALL_TENSOR,
) -> None:
    """Cast contiguous ``x`` into contiguous codes ``q`` with one scale (written to ``scale``,
    and its amax to ``amax`` when given)."""
    numel = x.numel()
    key = (numel, x.dtype, q.dtype, x.device, amax is None, fmt, pow2, emulate, config)

    def bind() -> Bound:
        return _quant_tensor_small_kernel.bind(
            (cdiv(numel, config.block),), x, q, scale, amax, numel,
            QMIN=fmt.qmin, QMAX=fmt.qmax, MANT=fmt.mantissa, EMIN=fmt.emin,
            IS_FLOAT=fmt.is_float, POW2=pow2, RETURN_AMAX=amax is not None, EMULATE=emulate,
            BLOCK=config.block, num_warps=config.num_warps,
        )  # fmt: skip

    launch = PLANS.get(("quant.small_tensor", key), None, bind)  # no setting of the Env changes it
    if amax is None:
        launch(x, q, scale)
    else:
        launch(x, q, scale, amax)


def quantize_strided(
    x3: torch.Tensor,
    q3: torch.Tensor,
    scale: torch.Tensor,
    zp: torch.Tensor | None,
    amax: torch.Tensor | None,
    k: int,
    fmt: QFormat,
    pow2: bool,
    emulate: bool,
    config: StridedConfig | None = None,
) -> None:
    """Launch over ``x3`` (n_outer, D, n_inner), groups of ``k`` along D; ``q3`` likewise."""
    n_outer, dim, n_inner = x3.shape
    if x3.numel() == 0:
        return
    cfg = config or StridedConfig()
    k_p2 = next_power_of_2(k)
    block_i = max(MIN_BLOCK_I, min(next_power_of_2(n_inner), cfg.block_elems // k_p2))
    grid = (n_outer * (dim // k), cdiv(n_inner, block_i))
    _quant_strided_kernel[grid](
        x3, q3, scale, zp, amax, n_inner, dim // k, *x3.stride(), *q3.stride(),
        QMIN=fmt.qmin, QMAX=fmt.qmax, MANT=fmt.mantissa, EMIN=fmt.emin,
        K=k, K_P2=k_p2, BLOCK_I=block_i,
        IS_FLOAT=fmt.is_float, ASYM=not fmt.symmetric, POW2=pow2,
        RETURN_AMAX=amax is not None, EMULATE=emulate, num_warps=cfg.num_warps,
    )  # fmt: skip


def _grid(mode: int, n_rows: int, n_cols: int, cfg: TwoPassConfig, iters: int) -> tuple:
    if mode == ROWS:
        return (cdiv(n_rows, cfg.block_r), cdiv(n_cols, cfg.block_c * iters))
    return (cdiv(n_rows, cfg.block_r * iters), cdiv(n_cols, cfg.block_c))


def amax_pass(
    x2: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor | None,
    mode: int,
    cols_per_scale: int,
    cfg: TwoPassConfig,
) -> None:
    """Atomic amax (ASYM: max and min) of ``x2`` (n_rows, n_cols) into zeroed ``hi``/``lo``."""
    n_rows, n_cols = x2.shape
    if x2.numel() == 0:
        return
    _amax_kernel[_grid(mode, n_rows, n_cols, cfg, AMAX_ITERS)](
        x2, hi, lo, n_rows, n_cols, *x2.stride(), cols_per_scale,
        MODE=mode, ASYM=lo is not None, ITERS=AMAX_ITERS,
        BLOCK_R=cfg.block_r, BLOCK_C=cfg.block_c, num_warps=cfg.num_warps,
    )  # fmt: skip


def cast_pass(
    x2: torch.Tensor,
    q2: torch.Tensor,
    qt2: torch.Tensor | None,
    src: torch.Tensor,
    src_lo: torch.Tensor | None,
    scale: torch.Tensor,
    zp: torch.Tensor | None,
    record: torch.Tensor | None,
    mode: int,
    source: int,
    cols_per_scale: int,
    fmt: QFormat,
    pow2: bool,
    emulate: bool,
    cfg: TwoPassConfig,
) -> None:
    """Cast ``x2`` into ``q2`` (and ``qt2``: same logical shape, other strides) with scales
    from ``src`` (see SOURCE); writes ``scale`` (and ``zp``); ``record``: amax of x, atomics."""
    n_rows, n_cols = x2.shape
    if x2.numel() == 0:
        return
    copy_t = None
    if qt2 is not None and x2.dtype == torch.float32 and not emulate:
        # On the H100 (Triton 3.6) the fused transposed store of float32 tiles left 12 of 48
        # columns of a 40 x 48 transpose unwritten (test_quant's tensorwise Float8Linear,
        # float32); 16-bit tiles store it right. There the transpose is torch's copy of the
        # codes (one more read and write of 1-byte codes).
        copy_t, qt2 = qt2, None
    qt_strides = qt2.stride() if qt2 is not None else (0, 0)
    _cast_kernel[_grid(mode, n_rows, n_cols, cfg, 1)](
        x2, q2, qt2, src, src_lo, scale, zp, record, n_rows, n_cols,
        *x2.stride(), *q2.stride(), *qt_strides, cols_per_scale,
        QMIN=fmt.qmin, QMAX=fmt.qmax, MANT=fmt.mantissa, EMIN=fmt.emin,
        MODE=mode, SOURCE=source, IS_FLOAT=fmt.is_float, ASYM=not fmt.symmetric, POW2=pow2,
        RECORD=record is not None, HAS_QT=qt2 is not None, PACK=fmt.packed, EMULATE=emulate,
        BLOCK_R=cfg.block_r, BLOCK_C=cfg.block_c, num_warps=cfg.num_warps,
    )  # fmt: skip
    if copy_t is not None:
        copy_t.copy_(q2)


def _launch(x2, w, scale, bias, out, cfg: WeightOnlyConfig) -> None:
    m, k = x2.shape
    n = w.shape[0]
    k_per_split = cdiv(cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    grid = (cdiv(n, cfg.block_n), cdiv(m, cfg.block_m), cfg.split_k)
    target = out
    if cfg.split_k > 1:
        target = torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x2.device)
    _wo_int8_kernel[grid](
        x2, w, scale, bias, target, m, n, k, *x2.stride(), *w.stride(),
        n, 1, m * n, k_per_split,
        HAS_BIAS=bias is not None, IEEE=x2.dtype == torch.float32,
        # The interpreter's bf16 tl.dot is wrong; float32 products of the same bf16 values are
        # exact, as the tensor cores' are, so the result is the GPU's up to the summation order.
        UPCAST=interpreter_enabled() and x2.dtype == torch.bfloat16,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if cfg.split_k > 1:
        sum_partials(target.view(cfg.split_k, m * n), out.view(m * n))


def _config(x2, w, scale, bias, out) -> WeightOnlyConfig:
    m, k = x2.shape
    n = w.shape[0]
    sms = sm_count(x2.device)
    if not _tuning.consulted():  # the interpreter: the default as is
        return default_config(m, n, k, sms)
    key = {"m": next_power_of_2(m), "n": n, "k": k, "dtype": str(x2.dtype)}

    def choose() -> WeightOnlyConfig:
        cands = [c.to_tuning() for c in _candidates(m, n, k, sms)]
        best = _tuning.tune(
            "int8_weight_only", key, cands,
            lambda c: _launch(x2, w, scale, bias, out, WeightOnlyConfig.from_tuning(c)),
        )  # fmt: skip
        return WeightOnlyConfig.from_tuning(best)

    return cached("int8_weight_only", tuple(key.items()), choose)


class WeightOnlyPlan:
    """``weight_only_fwd``'s plan for one input signature: the output's shape and the tiled
    kernel's config (None: chosen on the first run, tuned where tuning is on)."""

    __slots__ = ("config", "shape")

    def __init__(self, shape, config: WeightOnlyConfig | None):
        self.shape, self.config = shape, config

    def run(self, x2, w, scale, bias) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=x2.dtype, device=x2.device)
        if out.numel() == 0:
            return out
        if x2.shape[1] == 0:
            return out.zero_() if bias is None else out.copy_(bias.expand(self.shape))
        scale = scale.reshape(-1).contiguous()  # (N,) vectors, read with unit stride
        bias = bias.contiguous() if bias is not None else None
        cfg = self.config or _config(x2, w, scale, bias, out)
        _launch(x2, w, scale, bias, out, cfg)
        return out


# Every M takes the tiled weight-only kernel, decode sizes (a few tokens) too: on an H200 it
# beat the matmul family's decode kernel at every M 1-16 of both shapes timed
# (experiments/gpu_weight_only_decode.py; the figures are in docs/performance.md). The decode
# kernel stays the product's path for bf16 and FP8 weights (ops/matmul).


def weight_only_plan(x2, w, scale, bias, config: WeightOnlyConfig | None = None) -> WeightOnlyPlan:
    """The plan ``weight_only_fwd`` runs for these inputs (cached; built now if new)."""
    key = (signature(x2), signature(w), signature(scale), signature(bias), x2.device, config)

    def build() -> WeightOnlyPlan:
        return WeightOnlyPlan((x2.shape[0], w.shape[0]), config)

    return cached("int8_weight_only.plan", key, build)


def weight_only_fwd(
    x2: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    config: WeightOnlyConfig | None = None,
) -> torch.Tensor:
    """``(x2 @ w.T) * scale + bias`` for (M, K) x2 and an (N, K) int8 w; scale (N,) float32
    (or (N, 1), a column with unit stride: Int8Linear's buffer).

    ``config`` forces the tiled kernel with that config (tests)."""
    return weight_only_plan(x2, w, scale, bias, config).run(x2, w, scale, bias)


@dataclass(frozen=True)
class Plan:
    """How one (shape, block) is quantized: the kind of sharing and its 2-D view.

    kind: "tensor", "lastdim" (groups of ``group`` along the last dim), "cols" (a scale per
    ``group`` columns shared by all rows) or "dim" (groups of ``group`` along dim ``dim``).
    The 2-D view is (n_rows, n_cols); ``rows_per_scale`` and ``cols_per_scale`` map it to the
    scale tensor, which has the block-reduced shape and is contiguous.
    """

    kind: str
    group: int
    dim: int
    n_rows: int
    n_cols: int
    rows_per_scale: int
    cols_per_scale: int
    scale_shape: tuple[int, ...]


def block_error(shape: tuple[int, ...], block: tuple[int, ...]) -> str | None:
    """Why ``block`` cannot describe a granularity of ``shape`` (None if it can)."""
    if len(block) != len(shape):
        return f"block must have one entry per dimension of x ({len(shape)}), got {block}"
    for d, (n, b) in enumerate(zip(shape, block)):
        if not ((b >= 1 and n % b == 0) or b == n == 0):
            return f"block[{d}] = {b} must be >= 1 and divide x.shape[{d}] = {n}"
    return None


def plan(shape: tuple[int, ...], block: tuple[int, ...]) -> Plan:
    """The path for ``shape`` with ``block`` (validated by ``block_error`` first). It depends on
    nothing else (no setting of the Env): kept in the plan cache without one."""
    return PLANS.get(("quantize.plan", shape, block), None, lambda: _plan(shape, block))


def _plan(shape: tuple[int, ...], block: tuple[int, ...]) -> Plan:
    if not shape:
        return Plan("tensor", 1, 0, 1, 1, 1, 1, ())
    n = len(shape)
    n_cols = shape[-1]
    n_rows = math.prod(shape[:-1])
    scale_shape = tuple(s // b if b else 1 for s, b in zip(shape, block))
    if all(b == s for b, s in zip(block, shape)):
        return Plan("tensor", 1, 0, n_rows, n_cols, max(n_rows, 1), max(n_cols, 1), scale_shape)
    if all(b == 1 for b in block[:-1]):
        return Plan("lastdim", block[-1], n - 1, n_rows, n_cols, 1, block[-1], scale_shape)
    if tuple(block[:-1]) == tuple(shape[:-1]):
        return Plan(
            "cols", block[-1], n - 1, n_rows, n_cols, max(n_rows, 1), block[-1], scale_shape
        )
    grouped = [d for d in range(n - 1) if block[d] != 1]
    if len(grouped) == 1 and block[-1] == 1:
        d = grouped[0]
        rows = math.prod(shape[: d + 1])
        return Plan("dim", block[d], d, rows, math.prod(shape[d + 1 :]), block[d], 1, scale_shape)
    raise ValueError(
        f"block {block} of shape {shape}: supported are the whole tensor, groups along one "
        "dimension, and a scale per column (or group of columns) shared by all rows"
    )


def _view2d(x: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    """x as (n_rows, n_cols) without a copy where its strides allow (any 2-D x does)."""
    if x.dim() == 2 and tuple(x.shape) == (n_rows, n_cols):
        return x
    try:
        return x.view(n_rows, n_cols)
    except RuntimeError:
        LAYOUT_COPIES.count += 1
        return x.contiguous().view(n_rows, n_cols)


def _codes_shape(shape: tuple[int, ...], fmt: QFormat) -> tuple[int, ...]:
    if fmt.packed:
        return (*shape[:-1], shape[-1] // 2)
    return shape


def _alloc_codes(x: torch.Tensor, p: Plan, fmt: QFormat, layout: str):
    """(data, data_t, 2-D view of data): row-major, or column-major storage (``col``), or both."""
    dev = x.device
    shape = tuple(x.shape)
    if layout == "row":
        data = torch.empty(_codes_shape(shape, fmt), dtype=fmt.storage, device=dev)
        d2 = data.view(p.n_rows, p.n_cols // 2 if fmt.packed else p.n_cols)
        return data, torch.empty(0, dtype=fmt.storage, device=dev), d2, None
    stored_t = torch.empty((p.n_cols, p.n_rows), dtype=fmt.storage, device=dev)
    if layout == "col":
        return stored_t.t(), torch.empty(0, dtype=fmt.storage, device=dev), stored_t.t(), None
    data = torch.empty(shape, dtype=fmt.storage, device=dev)
    return data, stored_t, data, stored_t.t()


def check_layout(p: Plan, shape: tuple[int, ...], fmt: QFormat, layout: str) -> None:
    if layout == "row":
        return
    if len(shape) != 2 or fmt.packed:
        raise ValueError(f"layout {layout!r} needs a 2-D x and 8-bit codes, got shape {shape}")
    if (p.kind == "lastdim" and p.group != p.n_cols) or p.kind == "dim":
        raise ValueError(
            f"layout {layout!r} is for scales per tensor, per row or per column; got block "
            f"groups of {p.group} along dim {p.dim}"
        )


def quantize_fwd(
    x: torch.Tensor, fmt_name: str, block: list[int], pow2: bool, return_amax: bool, layout: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data, data_t, scale, zero_point, amax) of ``x`` quantized to ``fmt_name`` with a scale per
    ``block``; empty tensors stand for what was not asked (data_t without layout "both",
    zero_point for symmetric formats, amax without return_amax)."""
    fmt = FORMATS[fmt_name]
    p = plan(tuple(x.shape), tuple(block))
    dev = x.device
    emulate = interpreter_enabled()
    data, data_t, q2, qt2 = _alloc_codes(x, p, fmt, layout)
    scale = torch.empty(p.scale_shape, dtype=torch.float32, device=dev)
    nothing = torch.empty(0, dtype=torch.float32, device=dev)
    zp = torch.empty(p.scale_shape, dtype=torch.int32, device=dev) if not fmt.symmetric else None
    # An allocation, not nothing.to(int32): a copy is an op that computes, which replay's
    # recording (replay.py) cannot repeat.
    zp_out = zp if zp is not None else torch.empty(0, dtype=torch.int32, device=dev)
    if x.numel() == 0:  # nothing to cast; every scale is that of an all-zero group
        s, z = empty_group_scale(fmt, pow2)
        scale.fill_(s)
        if zp is not None:
            zp.fill_(z)
        amax = torch.zeros(p.scale_shape, dtype=torch.float32, device=dev)
        return data, data_t, scale, zp_out, amax if return_amax else nothing
    if p.kind == "tensor" and layout == "row" and SMALL_TENSOR.takes(x, fmt):
        amax = torch.empty(p.scale_shape, dtype=torch.float32, device=dev) if return_amax else None
        quantize_tensor_small(x, data, scale, amax, fmt, pow2, emulate)
        return data, data_t, scale, zp_out, amax if amax is not None else nothing
    one_pass_rows = p.kind == "lastdim" and layout == "row" and p.group <= MAX_GROUP
    if one_pass_rows and (x.dim() < 2 or x.stride(-1) == 1 or fmt.packed):
        amax = torch.empty(p.scale_shape, dtype=torch.float32, device=dev) if return_amax else None
        x2 = _view2d(x, p.n_rows, p.n_cols)
        if x2.stride(1) != 1:
            LAYOUT_COPIES.count += 1
            x2 = x2.contiguous()
        quantize_groups(
            x2, x2.stride(0), q2, q2.stride(0), scale, zp, amax, p.group, fmt, pow2, emulate
        )
        return data, data_t, scale, zp_out, amax if amax is not None else nothing
    if (p.kind == "dim" and fits_one_pass(p.group)) or (
        p.kind == "cols"
        and (p.group == 1 and fits_one_pass(p.n_rows) and layout != "both" and not fmt.packed)
    ):
        amax = torch.empty(p.scale_shape, dtype=torch.float32, device=dev) if return_amax else None
        if p.kind == "cols":
            x3, q3 = _view2d(x, p.n_rows, p.n_cols)[None], q2[None]
            k = p.n_rows
        else:
            outer = p.n_rows // x.shape[p.dim]
            x3 = _view2d(x, p.n_rows, p.n_cols).view(outer, x.shape[p.dim], p.n_cols)
            q3 = q2.view(outer, x.shape[p.dim], p.n_cols)
            k = p.group
        quantize_strided(x3, q3, scale, zp, amax, k, fmt, pow2, emulate)
        return data, data_t, scale, zp_out, amax if amax is not None else nothing
    if p.kind == "dim" and not (p.group == x.shape[p.dim] and p.n_rows == p.group):
        raise ValueError(
            f"groups of {p.group} along dim {p.dim} of shape {tuple(x.shape)}: groups of more "
            "than 512 along a dimension other than the last must span the leading dimensions "
            "(a scale per column)"
        )
    mode, x2, cps = _two_pass_view(x, p, q2)
    hi = torch.zeros(p.scale_shape, dtype=torch.float32, device=dev)
    lo = None if fmt.symmetric else torch.zeros(p.scale_shape, dtype=torch.float32, device=dev)
    cfg = TRANSPOSING_TILES if layout != "row" else ROW_MAJOR_TILES
    amax_pass(x2, hi, lo, mode, cps, cfg)
    q2v = q2 if p.kind != "lastdim" else q2.reshape(x2.shape[0], -1)
    cast_pass(x2, q2v, qt2, hi, lo, scale, zp, None, mode, FROM_AMAX, cps, fmt, pow2, emulate, cfg)
    return data, data_t, scale, zp_out, hi if return_amax else nothing


def _two_pass_view(x: torch.Tensor, p: Plan, q2: torch.Tensor):
    """(MODE, 2-D view of x, columns per scale) for the two-pass kernels."""
    if p.kind == "tensor":
        return TENSOR, _view2d(x, p.n_rows, p.n_cols), 1
    if p.kind == "lastdim":  # groups of G along the last dim: rows of G
        return ROWS, _view2d(x, p.n_rows * (p.n_cols // p.group), p.group), 1
    return COLS, _view2d(x, p.n_rows, p.n_cols), p.group


def quantize_with_scale_fwd(
    x: torch.Tensor,
    scale: torch.Tensor,
    fmt_name: str,
    block: list[int],
    given: str,
    record_amax: bool,
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data, data_t, scale, amax) of ``x`` cast with a given scale per ``block`` (one pass):
    ``given`` "scale" (dequantization scale) or "qscale" (the multiplier, a recipe's state);
    ``amax``: of x per scale when ``record_amax`` (else empty)."""
    fmt = FORMATS[fmt_name]
    p = plan(tuple(x.shape), tuple(block))
    dev = x.device
    data, data_t, q2, qt2 = _alloc_codes(x, p, fmt, layout)
    mode, x2, cps = _two_pass_view(x, p, q2)
    scale_out = torch.empty(p.scale_shape, dtype=torch.float32, device=dev)
    amax = torch.zeros(p.scale_shape, dtype=torch.float32, device=dev) if record_amax else None
    source = GIVEN_SCALE if given == "scale" else GIVEN_QSCALE
    cfg = TRANSPOSING_TILES if layout != "row" else ROW_MAJOR_TILES
    q2v = q2 if p.kind != "lastdim" else q2.reshape(x2.shape[0], -1)
    cast_pass(
        x2, q2v, qt2, scale.reshape(-1), None, scale_out, None, amax, mode, source, cps, fmt,
        False, interpreter_enabled(), cfg,
    )  # fmt: skip
    nothing = torch.empty(0, dtype=torch.float32, device=dev)
    return data, data_t, scale_out, amax if amax is not None else nothing


def dequantize_fwd(
    data: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    shape: list[int],
    block: list[int],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``(data - zero_point) * scale`` (scales expanded over ``block``) as ``out_dtype``."""
    p = plan(tuple(shape), tuple(block))
    out = torch.empty(shape, dtype=out_dtype, device=data.device)
    if out.numel() == 0:
        return out
    packed = data.dtype == torch.uint8
    q2 = _view2d(data, p.n_rows, p.n_cols // 2 if packed else p.n_cols)
    dequantize_2d(
        q2, scale, zero_point, out.view(p.n_rows, p.n_cols), p.rows_per_scale, p.cols_per_scale,
        packed,
    )  # fmt: skip
    return out
