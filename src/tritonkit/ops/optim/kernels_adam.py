"""Adam and AdamW: one multi-tensor kernel for every parameter of one dtype.

The update is PyTorch's ``_single_tensor_adam`` (torch/optim/adam.py), operation by operation
in float32, so that float32 results agree with ``torch.optim.Adam``/``AdamW`` to a few units
in the last place: ``exp_avg.lerp_(grad, 1 - beta1)`` (ATen's lerp formula),
``exp_avg_sq * beta2 + (1 - beta2) * grad * grad``, ``denom = sqrt(v) / sqrt(bc2) + eps``,
``param + (-lr / bc1) * (exp_avg / denom)``, with IEEE square root and division. The bias
corrections ``1 - beta ** step`` are computed per program in float64 from the tensor's own
step count (``exp(step * log(beta))``), as PyTorch computes them in double on the host: in
float32, ``1 - 0.999`` alone is off by 1e-5 relative. Step counts live on the device, one
copy per program (each program increments its own, so no two programs race on one value),
which makes the step free of host syncs and capturable in a CUDA graph.

16-bit parameters are updated in float32 and rounded once (to nearest, or stochastically,
``STOCHASTIC``), or read and written through a float32 master copy (``MASTER``), whose
moments are then float32 too.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops.optim.kernels import entry, load_f32, round_stochastic, store_as, torch_lerp

# Rows of an Adam table: where each program finds its tensor's addresses. The outputs have rows
# of their own so that the functional form (``adam_step``) can write new tensors; an optimizer
# points them at its inputs.
ROW_P = tl.constexpr(0)


ROW_G = tl.constexpr(1)


ROW_M = tl.constexpr(2)


ROW_V = tl.constexpr(3)


ROW_VMAX = tl.constexpr(4)


ROW_MASTER = tl.constexpr(5)


ROW_P_OUT = tl.constexpr(6)


ROW_M_OUT = tl.constexpr(7)


ROW_V_OUT = tl.constexpr(8)


ROW_VMAX_OUT = tl.constexpr(9)


N_ROWS = 10


@triton.jit
def _adam_block(
    table_ptr, t, n_tensors, offs, mask, rand_offs,
    grad_scale, step_size, bc2_sqrt, decay, w1, beta2, w2, eps, weight_decay, seed,
    P_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, OVERFLOW: tl.constexpr,
    MASKED: tl.constexpr, ALIGNED: tl.constexpr, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr,
    WEIGHT_DECAY: tl.constexpr, HAS_GRAD_SCALE: tl.constexpr, MASTER: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):  # fmt: skip
    g_ptr = entry(table_ptr, ROW_G, t, n_tensors, P_DTYPE, ALIGNED)
    g = load_f32(g_ptr, offs, mask, MASKED)
    if HAS_GRAD_SCALE:  # GradScaler's scale: unscale, and leave the gradient unscaled
        g = g / grad_scale
        store_as(g_ptr, offs, g, mask, MASKED)
    if MAXIMIZE:
        g = -g
    if MASTER:
        master_ptr = entry(table_ptr, ROW_MASTER, t, n_tensors, tl.float32, ALIGNED)
        p = load_f32(master_ptr, offs, mask, MASKED)
    else:
        p = load_f32(entry(table_ptr, ROW_P, t, n_tensors, P_DTYPE, ALIGNED), offs, mask, MASKED)
    if WEIGHT_DECAY == 1:
        g = g + weight_decay * p
    if WEIGHT_DECAY == 2:
        p = p * decay
    m = load_f32(entry(table_ptr, ROW_M, t, n_tensors, S_DTYPE, ALIGNED), offs, mask, MASKED)
    m = torch_lerp(m, g, w1)
    v = load_f32(entry(table_ptr, ROW_V, t, n_tensors, S_DTYPE, ALIGNED), offs, mask, MASKED)
    v = v * beta2 + w2 * g * g
    store_as(entry(table_ptr, ROW_M_OUT, t, n_tensors, S_DTYPE, ALIGNED), offs, m, mask, MASKED)
    store_as(entry(table_ptr, ROW_V_OUT, t, n_tensors, S_DTYPE, ALIGNED), offs, v, mask, MASKED)
    if AMSGRAD:
        v_max_ptr = entry(table_ptr, ROW_VMAX, t, n_tensors, S_DTYPE, ALIGNED)
        v_max = load_f32(v_max_ptr, offs, mask, MASKED)
        v = tl.maximum(v_max, v, propagate_nan=tl.PropagateNan.ALL)
        v_max_out = entry(table_ptr, ROW_VMAX_OUT, t, n_tensors, S_DTYPE, ALIGNED)
        store_as(v_max_out, offs, v, mask, MASKED)
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p + (-step_size) * tl.div_rn(m, denom)
    p_out = entry(table_ptr, ROW_P_OUT, t, n_tensors, P_DTYPE, ALIGNED)
    if MASTER:
        store_as(master_ptr, offs, p, mask, MASKED)
        store_as(p_out, offs, p, mask, MASKED)
    elif STOCHASTIC:
        store_as(p_out, offs, round_stochastic(p, seed, rand_offs, P_DTYPE, OVERFLOW), mask, MASKED)
    else:
        store_as(p_out, offs, p, mask, MASKED)


@kernel(do_not_specialize=["n_tensors", "seed"])
def _adam_kernel(
    chunk_tensor_ptr,  # int32 [n_chunks]: the tensor program c updates
    chunk_block_ptr,  # int32 [n_chunks]: which BLOCK of it
    step_ptr,  # float32 [n_chunks]: that tensor's step count (one copy per program)
    table_ptr,  # int64 [N_ROWS, n_tensors]: addresses (see ROW_*)
    numel_ptr,  # int64 [n_tensors]
    n_tensors,
    flag_ptr,  # float32 [1]: nonzero skips the step (a non-finite gradient), if HAS_FLAG
    grad_scale_ptr,  # float32 [1]: GradScaler's scale, if HAS_GRAD_SCALE
    lr_ptr,  # float32 [1]: the learning rate, if LR_ON_DEVICE (else lr)
    lr, w1, beta2, w2, log_beta1, log_beta2, eps, weight_decay,  # w1 = 1 - beta1, w2 = 1 - beta2
    seed,  # stochastic rounding: this step's seed
    P_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, OVERFLOW: tl.constexpr, BLOCK: tl.constexpr,
    ALIGNED: tl.constexpr, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr,
    WEIGHT_DECAY: tl.constexpr, HAS_FLAG: tl.constexpr, HAS_GRAD_SCALE: tl.constexpr,
    LR_ON_DEVICE: tl.constexpr, MASTER: tl.constexpr, STOCHASTIC: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0)
    if HAS_FLAG:  # noqa: SIM102 (a constexpr test, resolved when the kernel compiles)
        if tl.load(flag_ptr) != 0:
            return
    step = tl.load(step_ptr + c) + 1.0
    # Every warp loads the count, and a warp may run ahead and store step + 1 before a slower
    # warp of the program has loaded it: that warp would take the next step's bias correction
    # (seen on an H100 at 67M+ elements: runs of parameters updated as at step 2). All warps
    # load before any stores.
    tl.debug_barrier()
    tl.store(step_ptr + c, step)
    t = tl.load(chunk_tensor_ptr + c)
    start = tl.load(chunk_block_ptr + c).to(tl.int64) * BLOCK
    n = tl.load(numel_ptr + t)
    if LR_ON_DEVICE:
        lr64 = tl.load(lr_ptr).to(tl.float64)
    else:
        lr64 = tl.cast(lr, tl.float64)
    s64 = step.to(tl.float64)
    bc1 = 1.0 - tl.exp(s64 * tl.cast(log_beta1, tl.float64))
    bc2 = 1.0 - tl.exp(s64 * tl.cast(log_beta2, tl.float64))
    step_size = (lr64 / bc1).to(tl.float32)
    bc2_sqrt = tl.sqrt(bc2).to(tl.float32)
    decay = (1.0 - lr64 * tl.cast(weight_decay, tl.float64)).to(tl.float32)
    grad_scale = 1.0
    if HAS_GRAD_SCALE:
        grad_scale = tl.load(grad_scale_ptr)
    offs = start + tl.arange(0, BLOCK)
    rand_offs = c * BLOCK + tl.arange(0, BLOCK)  # distinct per element of the launch
    seed = seed + t  # the random stream of tensor t (rand_offs differ across its programs)
    if start + BLOCK <= n:  # a full block: unmasked, vectorized accesses
        _adam_block(
            table_ptr, t, n_tensors, offs, None, rand_offs,
            grad_scale, step_size, bc2_sqrt, decay, w1, beta2, w2, eps, weight_decay, seed,
            P_DTYPE, S_DTYPE, OVERFLOW, False, ALIGNED, AMSGRAD, MAXIMIZE, WEIGHT_DECAY,
            HAS_GRAD_SCALE, MASTER, STOCHASTIC,
        )  # fmt: skip
    else:
        _adam_block(
            table_ptr, t, n_tensors, offs, offs < n, rand_offs,
            grad_scale, step_size, bc2_sqrt, decay, w1, beta2, w2, eps, weight_decay, seed,
            P_DTYPE, S_DTYPE, OVERFLOW, True, ALIGNED, AMSGRAD, MAXIMIZE, WEIGHT_DECAY,
            HAS_GRAD_SCALE, MASTER, STOCHASTIC,
        )  # fmt: skip
