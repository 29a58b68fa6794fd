"""``quantize`` and ``dequantize``: a float tensor to codes with scales at any granularity, and
back; ``QuantizedTensor`` carries what the GEMMs (``tritonkit.scaled_matmul``,
``tritonkit.int8_matmul``) and ``dequantize`` take."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from tritonkit.ops._core.validate import check_choice, check_same_device, check_tensor
from tritonkit.ops.quant.config import FLOAT8, INT_BITS, LAYOUTS, QUANT_DTYPES, QFormat, get_format
from tritonkit.ops.quant.function import call_dequantize, call_quantize, call_quantize_with_scale
from tritonkit.ops.quant.plan import block_error, check_layout, plan

GRANULARITIES = ("tensor", "row", "column", "group")


class QuantizedTensor(NamedTuple):
    """Codes and the scales that dequantize them: ``x ~ (data - zero_point) * scale``, each
    scale (and zero point) repeated over its block.

    Attributes:
        data: the codes; int8, float8, or uint8 holding two 4-bit codes per byte (the first in
            the low nibble) with last dimension ``shape[-1] // 2``. Row-major, except with
            ``layout="col"`` (column-major: ``data.t()`` is contiguous).
        scale: float32 dequantization scales, of shape ``shape[d] // block[d]`` per dimension
            (``(M, 1)`` per row, ``(1, N)`` per column, ``(1, 1)`` per tensor of a matrix:
            what ``scaled_matmul`` takes).
        zero_point: int32, scale's shape (asymmetric integer formats), else None.
        block: elements sharing one scale along each dimension.
        shape: the quantized tensor's shape.
        dtype: the dtype it had (``dequantize``'s default).
        format: the code format's name ("float8_e4m3fn", "float8_e5m2", "int8", "int4_asym", ...).
        amax: float32 max |x| per block when asked for (``return_amax``), else None.
        data_t: with ``layout="both"``: the codes of the 2-D tensor's transpose, contiguous
            (``(N, M)``): the GEMM operand layout of the backward pass; else None.
    """

    data: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor | None
    block: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    format: str
    amax: torch.Tensor | None = None
    data_t: torch.Tensor | None = None

    @property
    def qformat(self) -> QFormat:
        from tritonkit.ops.quant.config import FORMATS

        return FORMATS[self.format]

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize(self, dtype)


def granularity_block(
    shape: tuple[int, ...], granularity: str, group_size: int | None = None, dim: int = -1
) -> tuple[int, ...]:
    """The block (elements per scale along each dimension) of a named granularity.

    "tensor": one scale; "row": one per row (token), the last dimension shared; "column":
    one per column (channel) of the last dimension, every other dimension shared; "group":
    one per ``group_size`` consecutive elements along ``dim``.
    """
    op = "tritonkit.quant.quantize"
    check_choice(op, "granularity", granularity, GRANULARITIES)
    n = len(shape)
    if n == 0:
        return ()
    if granularity == "tensor":
        return tuple(shape)
    if granularity == "row":
        return (*([1] * (n - 1)), shape[-1])
    if granularity == "column":
        return (*shape[:-1], 1)
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{op}: granularity 'group' needs group_size >= 1, got {group_size!r}")
    if not -n <= dim < n:
        raise ValueError(f"{op}: dim must be in [{-n}, {n - 1}] for shape {shape}, got {dim}")
    d = dim % n
    if shape[d] % group_size:
        raise ValueError(
            f"{op}: group_size {group_size} must divide x.shape[{dim}] = {shape[d]} (shape {shape})"
        )
    block = [1] * n
    block[d] = group_size
    return tuple(block)


def _check_format(op: str, dtype: object, bits: int, symmetric: bool) -> QFormat:
    if dtype not in QUANT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in QUANT_DTYPES)
        raise TypeError(f"{op}: dtype must be one of {names}, got {dtype}")
    if dtype in FLOAT8 and (bits != 8 or not symmetric):
        raise ValueError(
            f"{op}: float8 formats are 8-bit and symmetric, got bits={bits}, symmetric={symmetric}"
        )
    if bits not in INT_BITS:
        raise ValueError(f"{op}: bits must be one of {list(INT_BITS)}, got {bits!r}")
    return get_format(dtype, bits, symmetric)


def quantize(
    x: torch.Tensor,
    dtype: torch.dtype = torch.float8_e4m3fn,
    granularity: str = "tensor",
    *,
    group_size: int | None = None,
    dim: int = -1,
    block: tuple[int, ...] | None = None,
    bits: int = 8,
    symmetric: bool = True,
    scale: torch.Tensor | None = None,
    pow2_scale: bool = False,
    layout: str = "row",
    return_amax: bool = False,
    check_finite: bool = False,
) -> QuantizedTensor:
    """Quantize ``x`` to int8 (symmetric or with a zero point; 4 to 8 bits) or float8, with a
    scale per tensor, row, column or group, computed from x (dynamic) or given (static).

    Rounding (tritonkit/ops/quant/config.py, repeated bit for bit by
    ``tritonkit.quant.reference``): ``qscale = qmax / amax`` in float32, codes
    ``saturate(x * qscale)`` rounded to nearest even, ``scale = 1 / qscale``. The amax, the
    scale and the cast run in one pass over x when each scale's elements fit one program (per
    row, per group, per column of up to 512 rows), else in an amax pass and a cast pass (per
    tensor, per column of a long matrix); a given ``scale`` needs the cast pass alone.

    Non-finite inputs: +-inf saturates to the largest code and is not counted in amax; NaN
    stays NaN in float8 and becomes 0 in the integer formats; ``check_finite=True`` raises a
    ValueError instead (and synchronizes with the GPU).

    Args:
        x: float32, float16 or bfloat16 tensor on a CUDA device.
        dtype: torch.int8, torch.float8_e4m3fn or torch.float8_e5m2.
        granularity: "tensor", "row" (per token: one scale per index of the leading
            dimensions), "column" (per channel of the last dimension) or "group".
        group_size: elements per group along ``dim`` ("group"); must divide that dimension.
        dim: the dimension groups run along.
        block: instead of a granularity, the elements sharing a scale along each dimension
            (e.g. ``(M, 32)``: one scale per 32 channels over all rows).
        bits: integer width, 4 to 8 (int8 storage; 4-bit codes are packed two per byte along
            the last dimension, which must be even, as must groups along it).
        symmetric: False for asymmetric integer codes with a zero point (0 is exact).
        scale: static quantization: the float32 dequantization scale, of the scales' shape
            (see QuantizedTensor); codes are ``saturate(x * (1 / scale))``. Symmetric formats
            and scales per tensor, row (or group of the last dimension) or column only.
        pow2_scale: round each ``qscale`` down to a power of two (then ``scale`` is exact).
        layout: "row"; "col" (2-D x: column-major codes, the layout a GEMM's b operand scaled
            per column reads fastest); "both" (also ``data_t``, the transpose's codes).
        return_amax: also return the amax per block (symmetric formats).
        check_finite: raise on NaN or inf in x.

    Returns:
        A QuantizedTensor.
    """
    op = "tritonkit.quant.quantize"
    check_tensor(op, "x", x)
    fmt = _check_format(op, dtype, bits, symmetric)
    check_choice(op, "layout", layout, LAYOUTS)
    shape = tuple(x.shape)
    if block is None:
        block = granularity_block(shape, granularity, group_size, dim)
    else:
        block = tuple(int(b) for b in block)
    why = block_error(shape, block)
    if why:
        raise ValueError(f"{op}: {why}")
    try:
        p = plan(shape, block)
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from None
    if fmt.packed and (
        p.kind == "dim" or not shape or shape[-1] % 2 or (p.kind == "lastdim" and p.group % 2)
    ):
        raise ValueError(
            f"{op}: 4-bit codes are packed in pairs along the last dimension: they need an even "
            f"last dimension, split by groups of an even size if grouped along it, and no "
            f"groups along another dimension; got block {block} of shape {shape}"
        )
    try:
        check_layout(p, shape, fmt, layout)
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from None
    if return_amax and not fmt.symmetric:
        raise ValueError(f"{op}: return_amax is for symmetric formats")
    if check_finite and x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{op}: x has NaN or inf elements (check_finite=True)")
    block_list = list(block)
    if scale is not None:
        _check_static_scale(op, scale, x, fmt, p, pow2_scale)
        data, data_t, s, amax = call_quantize_with_scale(
            x, scale, fmt.name, block_list, "scale", return_amax, layout
        )
        zp = None
    else:
        data, data_t, s, zp, amax = call_quantize(
            x, fmt.name, block_list, pow2_scale, return_amax, layout
        )
    return QuantizedTensor(
        data, s, zp if not fmt.symmetric else None, block, shape, x.dtype, fmt.name,
        amax if return_amax else None, data_t if layout == "both" else None,
    )  # fmt: skip


def _check_static_scale(op, scale, x, fmt: QFormat, p, pow2: bool) -> None:
    check_tensor(op, "scale", scale, (torch.float32,))
    check_same_device(op, x=x, scale=scale)
    if not fmt.symmetric or pow2 or p.kind == "dim":
        raise ValueError(
            f"{op}: a given scale is for symmetric formats with scales per tensor, row or "
            f"column (and no pow2_scale); got format {fmt.name}, pow2_scale={pow2}, "
            f"groups along dim {p.dim}"
        )
    if tuple(scale.shape) != p.scale_shape and not (p.kind == "tensor" and scale.numel() == 1):
        raise ValueError(f"{op}: scale must have shape {p.scale_shape}, got {tuple(scale.shape)}")
    if not scale.is_contiguous():
        raise ValueError(f"{op}: scale must be contiguous")


def dequantize(q: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``(q.data - q.zero_point) * q.scale``, each scale repeated over its block, computed in
    float32 and rounded once to ``dtype``.

    Args:
        q: a QuantizedTensor (from ``quantize``).
        dtype: float32, float16 or bfloat16; default: the dtype q was quantized from.
    """
    op = "tritonkit.quant.dequantize"
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"{op}: q must be a QuantizedTensor, got {type(q).__name__}")
    dtype = q.dtype if dtype is None else dtype
    check_choice(op, "dtype", dtype, (torch.float32, torch.float16, torch.bfloat16))
    return call_dequantize(q.data, q.scale, q.zero_point, list(q.shape), list(q.block), dtype)


def numel_of(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
