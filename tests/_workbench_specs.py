"""Specs of the operator kinds beyond pure floating-point ones, each on a tiny real kernel:
an in-place update (``mutates``), integer and index inputs with an exact integer output,
an INT8 quantizer judged by SQNR, and a two-rank all-reduce (``distributed``, gloo on the CPU).

The specs are module attributes, not registered (they must not show in ``tritonkit list``);
the spawned ranks of the distributed one import this module to find it again.
"""

import dataclasses

import torch
import triton
import triton.language as tl

from tritonkit.harness.spec import SQNR, Baseline, Distributed, Exact, OpSpec, Shapes, Tolerance
from tritonkit.ops._core.launch import kernel
from tritonkit.specs._common import generator, nbytes, randn, read_write_bytes

BLOCK = 128


# ---- in place: y += alpha * x ---------------------------------------------------------------


@kernel
def _axpy_kernel(y_ptr, x_ptr, alpha, n, stride_y, stride_x, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs * stride_y, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + offs * stride_x, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs * stride_y, (y + alpha * x).to(y_ptr.dtype.element_ty), mask=mask)


def axpy_(y: torch.Tensor, x: torch.Tensor, alpha: float = 0.5) -> None:
    """y += alpha * x in place, for 1-D tensors of one length and dtype (any strides)."""
    if y.dim() != 1 or x.shape != y.shape:
        raise ValueError(f"axpy_: y and x must be 1-D of one length, got {y.shape}, {x.shape}")
    n = y.numel()
    if n:
        grid = (triton.cdiv(n, BLOCK),)
        _axpy_kernel[grid](y, x, alpha, n, y.stride(0), x.stride(0), BLOCK=BLOCK)


def _axpy_ref(y, x, alpha=0.5):
    y.add_(x, alpha=alpha)


def _eager(reference):
    return {"torch": Baseline("torch", lambda: reference, backward=False)}


def _two_inputs(shape, dtype, device, seed):
    gen = generator(device, seed)
    return randn(shape, dtype, device, gen), randn(shape, dtype, device, gen)


AXPY = OpSpec(
    name="demo.axpy_",
    family="demo",
    impl=axpy_,
    reference=_axpy_ref,
    baselines=_eager(_axpy_ref),
    make_inputs=_two_inputs,
    shapes=Shapes(test=[(7,), (300,)], bench=[(1 << 26,)], empty=[(0,)]),
    bytes=lambda inputs, mode, **p: read_write_bytes(inputs, (0,)),
    params=({}, {"alpha": -2.0}),
    backward=False,
    mutates=(0,),
)


# ---- integers and an index array: out = x[idx].int32 * 3 ------------------------------------


@kernel
def _gather_scale_kernel(out_ptr, x_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = tl.load(idx_ptr + offs, mask=mask, other=0)
    x = tl.load(x_ptr + idx, mask=mask).to(tl.int32)
    tl.store(out_ptr + offs, x * 3, mask=mask)


def gather_scale(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[idx] * 3 as int32, for int8 ``x`` and int64 ``idx`` (contiguous, 1-D)."""
    x, idx = x.contiguous(), idx.contiguous()
    out = torch.empty(idx.shape, dtype=torch.int32, device=idx.device)
    n = idx.numel()
    if n:
        _gather_scale_kernel[(triton.cdiv(n, BLOCK),)](out, x, idx, n, BLOCK=BLOCK)
    return out


def _gather_scale_ref(x, idx):
    return x[idx].to(torch.int32) * 3


def _int_inputs(shape, dtype, device, seed):
    (n,) = shape
    gen = generator(device, seed)
    x = torch.randint(-128, 128, (max(n, 1) + 5,), generator=gen, device=device, dtype=dtype)
    idx = torch.randint(0, x.numel(), (n,), generator=gen, device=device)
    return x, idx


GATHER_SCALE = OpSpec(
    name="demo.gather_scale",
    family="demo",
    impl=gather_scale,
    reference=_gather_scale_ref,
    baselines=_eager(_gather_scale_ref),
    make_inputs=_int_inputs,
    shapes=Shapes(test=[(1,), (7,), (300,)], bench=[(1 << 24,)], empty=[(0,)]),
    bytes=lambda inputs, mode, **p: nbytes(inputs[1]) * 2 + inputs[1].numel(),
    dtypes=(torch.int8,),
    backward=False,
    special_values=False,
    metrics={0: Exact()},
)


# ---- INT8 per-row quantization: q = round(x / scale), scale = amax / 127 ---------------------


@kernel
def _quant_rows_kernel(q_ptr, scale_ptr, x_ptr, n_cols, stride_x, stride_q, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / 127.0
    q = tl.minimum(tl.maximum(tl.floor(x / scale + 0.5), -127.0), 127.0)
    tl.store(q_ptr + row * stride_q + cols, q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row absmax INT8 quantization of a 2-D tensor: (q, scale) with x ~ q * scale."""
    x = x.contiguous()
    n_rows, n_cols = x.shape
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty((n_rows, 1), dtype=torch.float32, device=x.device)
    if x.numel():
        block = triton.next_power_of_2(n_cols)
        _quant_rows_kernel[(n_rows,)](q, scale, x, n_cols, x.stride(0), q.stride(0), BLOCK=block)
    return q, scale


def _quant_rows_ref(x):
    # In float64 the reference returns the exact quotient each integer stands for, so SQNR
    # measures the quantization noise; in the inputs' dtype, what PyTorch would store.
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp_min(1e-12) / 127.0
    q = x.double() / scale.double()
    if x.dtype != torch.float64:
        q = q.round().clamp(-127, 127).to(torch.int8)
    return q, scale


QUANT_ROWS = OpSpec(
    name="demo.quantize_rows_int8",
    family="demo",
    impl=quantize_rows_int8,
    reference=_quant_rows_ref,
    baselines=_eager(_quant_rows_ref),
    make_inputs=lambda shape, dtype, device, seed: (
        randn(shape, dtype, device, generator(device, seed)),
    ),
    shapes=Shapes(test=[(3, 129), (17, 40)], bench=[(8192, 8192)], empty=[(0, 8)]),
    bytes=lambda inputs, mode, **p: nbytes(inputs[0]) + inputs[0].numel(),
    dtypes=(torch.float32, torch.bfloat16),
    backward=False,
    special_values=False,
    # Rounding to the nearest integer: |error| <= 1/2 (plus float32's rounding of x / scale),
    # about 40-45 dB on normal rows of this length.
    metrics={0: SQNR(min_db=35.0, max_abs=0.5 + 1e-4), 1: Tolerance(atol=0.0, rtol=1e-6)},
)


# ---- two ranks: all-reduce (sum) through all_gather and a fixed-order sum -------------------


@kernel
def _sum_ranks_kernel(out_ptr, parts_ptr, n, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in tl.static_range(WORLD):  # rank order: every rank gets the same bits
        acc += tl.load(parts_ptr + r * n + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the ranks of the default process group, as a new tensor."""
    world = torch.distributed.get_world_size()
    x = x.contiguous()
    parts = torch.empty((world, *x.shape), dtype=x.dtype, device=x.device)
    torch.distributed.all_gather(list(parts.unbind(0)), x)
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        grid = (triton.cdiv(n, BLOCK),)
        _sum_ranks_kernel[grid](out, parts, n, WORLD=world, BLOCK=BLOCK)
    return out


def _all_reduce_ref(x):
    out = x.clone()
    torch.distributed.all_reduce(out)
    return out


ALL_REDUCE = OpSpec(
    name="demo.all_reduce_sum",
    family="demo",
    impl=all_reduce_sum,
    reference=_all_reduce_ref,
    baselines=_eager(_all_reduce_ref),
    make_inputs=lambda shape, dtype, device, seed: (
        randn(shape, dtype, device, generator(device, seed)),
    ),
    shapes=Shapes(test=[(7,), (3, 129)], bench=[(1 << 24,)], empty=[(0,)]),
    bytes=lambda inputs, mode, **p: 2 * nbytes(inputs[0]),
    dtypes=(torch.float32, torch.bfloat16),
    backward=False,
    distributed=Distributed(world_size=2),
)

# A wrong all-reduce (each rank's own input back): the engine must fail it on every rank.
ALL_REDUCE_WRONG = dataclasses.replace(
    ALL_REDUCE, name="demo.all_reduce_wrong", impl=lambda x: x.clone()
)
