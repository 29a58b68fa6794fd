"""@triton.jit helpers the optimizer kernels share: PyTorch's lerp, stochastic rounding, loads
and stores in float32, the multi-tensor table's entries."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def torch_lerp(start, end, weight):
    """``torch.lerp(start, end, weight)`` with ATen's formula (``Lerp.h``): ``start + w (end -
    start)`` for ``|w| < 0.5``, else ``end - (end - start)(1 - w)``, so that a moment updated
    here rounds as ``exp_avg.lerp_(grad, 1 - beta1)`` does in PyTorch."""
    small = start + weight * (end - start)
    large = end - (end - start) * (1.0 - weight)
    return tl.where(tl.abs(weight) < 0.5, small, large)


@triton.jit
def round_stochastic(x, seed, offsets, DTYPE: tl.constexpr, OVERFLOW: tl.constexpr):
    """float32 ``x`` rounded to the 16-bit ``DTYPE`` up or down at random, with the probability
    that makes the rounding unbiased: E[round(x)] = x.

    The two candidates are x rounded toward zero and its neighbour away from zero (the bit
    pattern plus one: sign-magnitude formats order magnitudes as integers). ``OVERFLOW`` is
    the magnitude from which round-to-nearest gives infinity; there it is kept, as PyTorch's
    rounding would give. NaN and infinities pass through.
    """
    low = x.to(DTYPE, fp_downcast_rounding="rtz")
    high = (low.to(tl.int16, bitcast=True) + 1).to(DTYPE, bitcast=True)
    low32 = low.to(tl.float32)
    frac = tl.div_rn(x - low32, high.to(tl.float32) - low32)  # in [0, 1); NaN for NaN/inf
    out = tl.where(tl.rand(seed, offsets) < frac, high, low)
    return tl.where(tl.abs(x) >= OVERFLOW, x.to(DTYPE), out)


@triton.jit
def load_f32(ptr, offs, mask, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return tl.load(ptr + offs).to(tl.float32)


@triton.jit
def store_as(ptr, offs, value, mask, MASKED: tl.constexpr):
    """Store float32 ``value`` rounded to nearest in the pointer's dtype."""
    if ptr.dtype.element_ty == tl.bfloat16:
        value = value.to(tl.bfloat16)
    if MASKED:
        tl.store(ptr + offs, value.to(ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ptr + offs, value.to(ptr.dtype.element_ty))


@triton.jit
def entry(table_ptr, row, t, n_tensors, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """The address of tensor ``t`` in ``row`` of the table, typed; 16-byte aligned if known."""
    ptr = tl.load(table_ptr + row * n_tensors + t).to(tl.pointer_type(DTYPE))
    if ALIGNED:
        ptr = tl.multiple_of(ptr, 16)
    return ptr


@triton.jit
def load_chunk_f32(
    chunk_tensor_ptr, chunk_block_ptr, table_ptr, numel_ptr, n_tensors, row,
    DTYPE: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip
    """(t, x): the tensor this program's chunk reads and its BLOCK elements of table ``row``
    in float32, 0 past the tensor's end (unmasked, vectorized loads for a full block): the
    prologue of the one-pass reductions over a gradient table (the norm, the finite check)."""
    c = tl.program_id(0)
    t = tl.load(chunk_tensor_ptr + c)
    start = tl.load(chunk_block_ptr + c).to(tl.int64) * BLOCK
    n = tl.load(numel_ptr + t)
    offs = start + tl.arange(0, BLOCK)
    ptr = entry(table_ptr, row, t, n_tensors, DTYPE, ALIGNED)
    if start + BLOCK <= n:
        x = load_f32(ptr, offs, None, False)
    else:
        x = load_f32(ptr, offs, offs < n, True)
    return t, x
