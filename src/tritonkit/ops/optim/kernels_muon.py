"""Muon's elementwise passes, each one multi-tensor launch over a param group's matrices.

A Muon step is ``torch.optim.Muon``'s (torch/optim/_muon.py), per matrix parameter:

1. ``momentum``: ``buf.lerp_(g, 1 - mu)``; the update ``g.lerp(buf, mu)`` (Nesterov) or
   ``buf``, rounded to bfloat16 into the matrix's slot of its shape's Newton-Schulz batch,
   and each program's sum of squares of what it wrote (for the Frobenius norm).
2. ``normalize``: one program per matrix sums its partial sums (a fixed order: the result
   does not depend on scheduling), rounds the norm to bfloat16 as PyTorch's bfloat16
   ``norm()`` does and clamps it to ``eps``; then every block is divided by its matrix's norm.
3. Newton-Schulz (``kernels_newton_schulz.py``), batched per shape.
4. ``apply``: ``p *= 1 - lr * wd``; ``p += -lr * ratio * O`` (``ratio`` from
   ``adjust_lr_fn``, per matrix).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops.optim.kernels import entry, load_f32, store_as, torch_lerp

# Rows of a Muon table.
ROW_P = tl.constexpr(0)


ROW_G = tl.constexpr(1)


ROW_BUF = tl.constexpr(2)  # the momentum buffer


ROW_X = tl.constexpr(3)  # the matrix's slot in its Newton-Schulz batch (input)


ROW_O = tl.constexpr(4)  # the slot holding the orthogonalized update (output)


N_ROWS = 5


@triton.jit
def _momentum_block(
    table_ptr, t, n_tensors, offs, mask, grad_scale, momentum, w,
    P_DTYPE: tl.constexpr, MASKED: tl.constexpr, ALIGNED: tl.constexpr,
    NESTEROV: tl.constexpr, HAS_GRAD_SCALE: tl.constexpr,
):  # fmt: skip
    g_ptr = entry(table_ptr, ROW_G, t, n_tensors, P_DTYPE, ALIGNED)
    g = load_f32(g_ptr, offs, mask, MASKED)
    if HAS_GRAD_SCALE:
        g = g / grad_scale
        store_as(g_ptr, offs, g, mask, MASKED)
    buf_ptr = entry(table_ptr, ROW_BUF, t, n_tensors, P_DTYPE, ALIGNED)
    buf = torch_lerp(load_f32(buf_ptr, offs, mask, MASKED), g, w)
    store_as(buf_ptr, offs, buf, mask, MASKED)
    buf = buf.to(P_DTYPE).to(tl.float32)  # PyTorch reads the buffer back in its dtype
    if NESTEROV:
        update = torch_lerp(g, buf, momentum)
    else:
        update = buf
    x = update.to(P_DTYPE).to(tl.float32).to(tl.bfloat16)  # in the param's dtype, then .bfloat16()
    store_as(entry(table_ptr, ROW_X, t, n_tensors, tl.bfloat16, ALIGNED), offs, x, mask, MASKED)
    x32 = x.to(tl.float32)
    return tl.sum(x32 * x32, axis=0)


@kernel(do_not_specialize=["n_tensors"])
def _muon_momentum_kernel(
    chunk_tensor_ptr,  # int32 [n_chunks]: the tensor program c updates
    chunk_block_ptr,  # int32 [n_chunks]: which BLOCK of it
    table_ptr,  # int64 [N_ROWS, n_tensors]: addresses (see ROW_*)
    numel_ptr,  # int64 [n_tensors]
    n_tensors,
    partial_ptr,  # float32 [n_chunks]: sum of squares of the bfloat16 update, per program
    flag_ptr,  # float32 [1]: nonzero skips the step, if HAS_FLAG
    grad_scale_ptr,  # float32 [1]: GradScaler's scale, if HAS_GRAD_SCALE
    momentum, w,  # w = 1 - momentum, rounded once as PyTorch rounds it
    P_DTYPE: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr, NESTEROV: tl.constexpr,
    HAS_FLAG: tl.constexpr, HAS_GRAD_SCALE: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0)
    if HAS_FLAG:  # noqa: SIM102 (a constexpr test, resolved when the kernel compiles)
        if tl.load(flag_ptr) != 0:
            return
    t = tl.load(chunk_tensor_ptr + c)
    start = tl.load(chunk_block_ptr + c).to(tl.int64) * BLOCK
    n = tl.load(numel_ptr + t)
    offs = start + tl.arange(0, BLOCK)
    grad_scale = 1.0
    if HAS_GRAD_SCALE:
        grad_scale = tl.load(grad_scale_ptr)
    if start + BLOCK <= n:
        sq = _momentum_block(
            table_ptr, t, n_tensors, offs, None, grad_scale, momentum, w,
            P_DTYPE, False, ALIGNED, NESTEROV, HAS_GRAD_SCALE,
        )  # fmt: skip
    else:
        sq = _momentum_block(
            table_ptr, t, n_tensors, offs, offs < n, grad_scale, momentum, w,
            P_DTYPE, True, ALIGNED, NESTEROV, HAS_GRAD_SCALE,
        )  # fmt: skip
    tl.store(partial_ptr + c, sq)


@kernel
def _muon_norm_kernel(
    partial_ptr,  # float32 [n_chunks]: from the momentum pass
    first_chunk_ptr,  # int32 [n_tensors]: tensor t's programs are first .. first + count - 1
    n_chunks_ptr,  # int32 [n_tensors]
    norm_ptr,  # float32 [n_tensors]: out, max(bf16(||X_t||), eps)
    eps,  # torch's clamp(min=eps), eps already rounded to bfloat16
    PARTIALS: tl.constexpr,
):
    t = tl.program_id(0)
    first = tl.load(first_chunk_ptr + t)
    count = tl.load(n_chunks_ptr + t)
    acc = tl.zeros((PARTIALS,), dtype=tl.float32)
    for k in range(0, count, PARTIALS):
        idx = k + tl.arange(0, PARTIALS)
        acc += tl.load(partial_ptr + first + idx, mask=idx < count, other=0.0)
    # PyTorch's norm() of a bfloat16 tensor accumulates in float32 and returns bfloat16.
    norm = tl.sqrt_rn(tl.sum(acc, axis=0)).to(tl.bfloat16).to(tl.float32)
    tl.store(norm_ptr + t, tl.maximum(norm, eps))


@kernel(do_not_specialize=["n_tensors"])
def _muon_normalize_kernel(
    chunk_tensor_ptr, chunk_block_ptr, table_ptr, numel_ptr, n_tensors,
    norm_ptr,  # float32 [n_tensors]
    flag_ptr,
    BLOCK: tl.constexpr, ALIGNED: tl.constexpr, HAS_FLAG: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0)
    if HAS_FLAG:  # noqa: SIM102 (a constexpr test, resolved when the kernel compiles)
        if tl.load(flag_ptr) != 0:
            return
    t = tl.load(chunk_tensor_ptr + c)
    start = tl.load(chunk_block_ptr + c).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < tl.load(numel_ptr + t)
    x_ptr = entry(table_ptr, ROW_X, t, n_tensors, tl.bfloat16, ALIGNED)
    x = load_f32(x_ptr, offs, mask, True)
    store_as(x_ptr, offs, tl.div_rn(x, tl.load(norm_ptr + t)).to(tl.bfloat16), mask, True)


@kernel(do_not_specialize=["n_tensors"])
def _muon_apply_kernel(
    chunk_tensor_ptr, chunk_block_ptr, table_ptr, numel_ptr, n_tensors,
    ratio_ptr,  # float32 [n_tensors]: adjust_lr_fn's factor of each matrix
    flag_ptr,
    lr_ptr,  # float32 [1]: the learning rate, if LR_ON_DEVICE (else lr)
    lr, weight_decay,
    P_DTYPE: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr,
    HAS_FLAG: tl.constexpr, LR_ON_DEVICE: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0)
    if HAS_FLAG:  # noqa: SIM102 (a constexpr test, resolved when the kernel compiles)
        if tl.load(flag_ptr) != 0:
            return
    t = tl.load(chunk_tensor_ptr + c)
    start = tl.load(chunk_block_ptr + c).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < tl.load(numel_ptr + t)
    if LR_ON_DEVICE:
        lr64 = tl.load(lr_ptr).to(tl.float64)
    else:
        lr64 = tl.cast(lr, tl.float64)
    decay = (1.0 - lr64 * tl.cast(weight_decay, tl.float64)).to(tl.float32)
    alpha = (-lr64 * tl.load(ratio_ptr + t).to(tl.float64)).to(tl.float32)
    p_ptr = entry(table_ptr, ROW_P, t, n_tensors, P_DTYPE, ALIGNED)
    o = load_f32(entry(table_ptr, ROW_O, t, n_tensors, tl.bfloat16, ALIGNED), offs, mask, True)
    p = load_f32(p_ptr, offs, mask, True) * decay
    store_as(p_ptr, offs, p + alpha * o, mask, True)
