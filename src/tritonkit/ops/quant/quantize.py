"""Quantize and dequantize launchers: from a block shape (how many elements share one scale
along each dimension) to the kernel path that moves the fewest bytes, and their registration
as ``torch.library`` ops.

Paths, by which elements share a scale:

- groups of G consecutive elements of the last dimension (per row when G is the row):
  one pass (groups.py), or amax pass + cast pass when G exceeds one program (twopass.py);
- groups of k along another dimension: one pass (strided.py) for k up to 512;
- a whole column (per channel), groups of channels, the whole tensor: an amax pass with
  atomics, then the cast pass (twopass.py): two reads, the fewest for a scale that depends on
  elements other programs read; except a small tensor with one scale (a decode step's
  activations): one launch in which every program reads all of it (small.py).

A scale given by the caller (static, delayed or EMA scaling) needs no amax pass: the cast pass
alone, which can return the amax of what it cast (``quantize_with_scale``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tritonkit.ops._core.device import interpreter_enabled
from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops._core.plan import PLANS
from tritonkit.ops._core.registry import define_op, eager_direct
from tritonkit.ops.quant import twopass
from tritonkit.ops.quant.dequant import dequantize_2d
from tritonkit.ops.quant.formats import FLOAT8, QFormat, empty_group_scale, int_format
from tritonkit.ops.quant.groups import MAX_GROUP, quantize_groups
from tritonkit.ops.quant.small import SMALL_TENSOR, quantize_tensor_small
from tritonkit.ops.quant.strided import fits_one_pass, quantize_strided

LAYOUTS = ("row", "col", "both")
FORMATS: dict[str, QFormat] = {
    **{f.name: f for f in FLOAT8.values()},
    **{int_format(b, s).name: int_format(b, s) for b in range(4, 9) for s in (True, False)},
}


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
    cfg = twopass.TRANSPOSING_TILES if layout != "row" else twopass.ROW_MAJOR_TILES
    twopass.amax_pass(x2, hi, lo, mode, cps, cfg)
    q2v = q2 if p.kind != "lastdim" else q2.reshape(x2.shape[0], -1)
    twopass.cast_pass(
        x2, q2v, qt2, hi, lo, scale, zp, None, mode, twopass.FROM_AMAX, cps, fmt, pow2, emulate, cfg
    )
    return data, data_t, scale, zp_out, hi if return_amax else nothing


def _two_pass_view(x: torch.Tensor, p: Plan, q2: torch.Tensor):
    """(MODE, 2-D view of x, columns per scale) for the two-pass kernels."""
    if p.kind == "tensor":
        return twopass.TENSOR, _view2d(x, p.n_rows, p.n_cols), 1
    if p.kind == "lastdim":  # groups of G along the last dim: rows of G
        return twopass.ROWS, _view2d(x, p.n_rows * (p.n_cols // p.group), p.group), 1
    return twopass.COLS, _view2d(x, p.n_rows, p.n_cols), p.group


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
    source = twopass.GIVEN_SCALE if given == "scale" else twopass.GIVEN_QSCALE
    cfg = twopass.TRANSPOSING_TILES if layout != "row" else twopass.ROW_MAJOR_TILES
    q2v = q2 if p.kind != "lastdim" else q2.reshape(x2.shape[0], -1)
    twopass.cast_pass(
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


# ---- torch.library registration ------------------------------------------------------------


@define_op("tritonkit::quantize")
def _quantize_op(
    x: torch.Tensor, fmt_name: str, block: list[int], pow2: bool, return_amax: bool, layout: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantize_fwd(x, fmt_name, block, pow2, return_amax, layout)


def _fake_outputs(x: torch.Tensor, fmt: QFormat, block: list[int], layout: str):
    p = plan(tuple(x.shape), tuple(block))
    shape = tuple(x.shape)
    if layout == "col":
        data = x.new_empty((p.n_cols, p.n_rows), dtype=fmt.storage).t()
    else:
        data = x.new_empty(_codes_shape(shape, fmt), dtype=fmt.storage)
    rows_cols = (p.n_cols, p.n_rows) if layout == "both" else (0,)
    return p, data, x.new_empty(rows_cols, dtype=fmt.storage)


@_quantize_op.register_fake
def _(x, fmt_name, block, pow2, return_amax, layout):
    fmt = FORMATS[fmt_name]
    p, data, data_t = _fake_outputs(x, fmt, block, layout)
    scale = x.new_empty(p.scale_shape, dtype=torch.float32)
    zp = x.new_empty(p.scale_shape if not fmt.symmetric else (0,), dtype=torch.int32)
    amax = x.new_empty(p.scale_shape if return_amax else (0,), dtype=torch.float32)
    return data, data_t, scale, zp, amax


@define_op("tritonkit::quantize_with_scale")
def _quantize_with_scale_op(
    x: torch.Tensor,
    scale: torch.Tensor,
    fmt_name: str,
    block: list[int],
    given: str,
    record_amax: bool,
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantize_with_scale_fwd(x, scale, fmt_name, block, given, record_amax, layout)


@_quantize_with_scale_op.register_fake
def _(x, scale, fmt_name, block, given, record_amax, layout):
    p, data, data_t = _fake_outputs(x, FORMATS[fmt_name], block, layout)
    out_scale = x.new_empty(p.scale_shape, dtype=torch.float32)
    amax = x.new_empty(p.scale_shape if record_amax else (0,), dtype=torch.float32)
    return data, data_t, out_scale, amax


@define_op("tritonkit::dequantize")
def _dequantize_op(
    data: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    shape: list[int],
    block: list[int],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return dequantize_fwd(data, scale, zero_point, shape, block, out_dtype)


@_dequantize_op.register_fake
def _(data, scale, zero_point, shape, block, out_dtype):
    return data.new_empty(shape, dtype=out_dtype)


call_quantize = eager_direct(_quantize_op)
call_quantize_with_scale = eager_direct(_quantize_with_scale_op)
call_dequantize = eager_direct(_dequantize_op)
