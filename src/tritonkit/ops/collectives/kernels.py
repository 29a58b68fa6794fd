"""The collectives' kernels: the ring's reduction, the compressed all-reduce's quantize (with
error feedback) and dequantize-accumulate-requantize, and the symmetric-memory all-reduces.

Wire layout of the compressed all-reduce (``plan.py`` builds the views): the flat input, padded
to ``world * shard`` elements, is ``world`` chunks of ``shard = blocks_per_shard * B`` elements;
chunk ``c`` goes on the wire as ``shard`` code bytes followed by ``blocks_per_shard`` float32
scales, so one ``all_to_all`` and one ``all_gather`` move codes and scales together. Kernels
see the codes as a ``(world, shard)`` view and the scales as a ``(world, blocks_per_shard)``
view, both with the chunk's row stride.

Symmetric memory (``torch.distributed._symmetric_memory``): every rank allocated the same
buffer, and ``buffer_ptrs_dev`` / ``signal_pad_ptrs_dev`` are device tables of the peers'
addresses (uint64). A kernel loads a peer's base from the table and casts it to a typed
pointer. Ranks synchronize per program through the signal pads, by epochs: the host counts
the barriers of each workspace (the same count on every rank, since every rank makes the same
calls) and passes a kernel its barrier's epoch; program ``b`` of rank ``r`` writes the epoch
into slot ``b * WORLD + r`` of every peer's pad (an exchange, release, system scope) and waits
until slot ``b * WORLD + p`` of its own pad holds that epoch or a later one for every peer
``p`` (atomic reads, acquire). Nothing is reset, so a barrier costs one round of signals.
Calls alternate between the two halves of the buffers (``buf_off``), which makes the closing
barrier unnecessary (see ``_one_shot_kernel``). Programs must be laid out alike on every rank
(same shapes, same grid), which the public functions ensure. Peer memory is loaded with
``.cv`` (no stale cached lines of an earlier call).
"""

import triton
import triton.language as tl

from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.quant_codes import encode, finite_abs, symmetric_scales

# Reduction ops of the ring (torch.distributed.ReduceOp's subset that it implements).
OP_SUM = tl.constexpr(0)
OP_MAX = tl.constexpr(1)
OP_MIN = tl.constexpr(2)
OP_PROD = tl.constexpr(3)
# Polls of a signal slot before a barrier gives up: seconds of system-scope atomics, so that a
# dead peer ends the wait instead of hanging the GPU.
SPIN_LIMIT = tl.constexpr(1 << 24)


@triton.jit
def _combine(a, b, OP: tl.constexpr):
    if OP == OP_MAX:
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    elif OP == OP_MIN:
        return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    elif OP == OP_PROD:
        return a * b
    else:
        return a + b


@kernel
def _ring_reduce_kernel(
    acc_ptr,  # (n,) this rank's chunk, updated in place
    x_ptr,  # (n,) the chunk received from the left neighbour
    n,
    alpha,  # multiplies the result (1 / world on the last step of an average)
    OP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(acc_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(acc_ptr + offs, (_combine(a, b, OP) * alpha).to(acc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_blocks(
    v,  # (BLOCK_G, B) float32 values
    QMAX: tl.constexpr,
    IS_FLOAT: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """(codes as float32, their dequantized values, scale per block): symmetric, one scale per
    row of ``v``, rounded as the quant family rounds (ops/quant/config.py)."""
    amax = tl.max(finite_abs(v), axis=1)
    qscale, scale = symmetric_scales(amax, QMAX, False)
    zp = tl.zeros_like(qscale)[:, None]
    codes = encode(v * qscale[:, None], zp, -QMAX, QMAX, IS_FLOAT, MANT, EMIN, EMULATE)
    codes = codes.to(tl.float32)
    return codes, codes * scale[:, None], scale


@kernel
def _ef_quantize_kernel(
    x_ptr,  # (n,) input, contiguous
    res_ptr,  # (world * shard,) float32 error-feedback residual, read and rewritten (HAS_RES)
    q_ptr,  # (world, shard) codes, rows stride_qc apart
    s_ptr,  # (world, blocks_per_shard) float32 scales, rows stride_sc apart
    n,  # valid input elements (the rest of the padded vector counts as 0)
    n_blocks,  # world * blocks_per_shard
    blocks_per_shard,
    stride_qc,
    stride_sc,
    QMAX: tl.constexpr,
    IS_FLOAT: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    B: tl.constexpr,  # elements per scale
    BLOCK_G: tl.constexpr,  # blocks per program
    HAS_RES: tl.constexpr,
    EMULATE: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    j = tl.arange(0, B)
    g_ok = g < n_blocks
    offs = g[:, None] * B + j[None, :]
    x = tl.load(x_ptr + offs, mask=g_ok[:, None] & (offs < n), other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(res_ptr + offs, mask=g_ok[:, None], other=0.0)
    codes, deq, scale = _quantize_blocks(x, QMAX, IS_FLOAT, MANT, EMIN, EMULATE)
    if HAS_RES:
        # Error feedback: what this step's codes failed to carry goes into the next step.
        tl.store(res_ptr + offs, x - deq, mask=g_ok[:, None])
    chunk = g // blocks_per_shard
    jb = g - chunk * blocks_per_shard
    q_offs = (chunk * stride_qc + jb * B)[:, None] + j[None, :]
    tl.store(q_ptr + q_offs, codes.to(q_ptr.dtype.element_ty), mask=g_ok[:, None])
    tl.store(s_ptr + chunk * stride_sc + jb, scale, mask=g_ok)


@kernel
def _dequant_acc_requant_kernel(
    rq_ptr,  # (WORLD, shard) received codes of this rank's shard, rows stride_rq apart
    rs_ptr,  # (WORLD, blocks_per_shard) their scales, rows stride_rs apart
    q_ptr,  # (shard,) requantized codes of the reduced shard
    s_ptr,  # (blocks_per_shard,) their scales, times alpha (what every rank dequantizes with)
    res_ptr,  # (shard,) float32 residual of the requantization, read and rewritten (HAS_RES)
    blocks_per_shard,
    stride_rq,
    stride_rs,
    alpha,  # 1, or 1 / world for an average
    WORLD: tl.constexpr,
    QMAX: tl.constexpr,
    IS_FLOAT: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    B: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HAS_RES: tl.constexpr,
    EMULATE: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    j = tl.arange(0, B)
    g_ok = g < blocks_per_shard
    offs = g[:, None] * B + j[None, :]
    acc = tl.zeros((BLOCK_G, B), dtype=tl.float32)
    for c in tl.static_range(WORLD):
        code = tl.load(rq_ptr + c * stride_rq + offs, mask=g_ok[:, None], other=0.0)
        scale = tl.load(rs_ptr + c * stride_rs + g, mask=g_ok, other=0.0)
        acc += code.to(tl.float32) * scale[:, None]
    if HAS_RES:
        acc += tl.load(res_ptr + offs, mask=g_ok[:, None], other=0.0)
    codes, deq, scale = _quantize_blocks(acc, QMAX, IS_FLOAT, MANT, EMIN, EMULATE)
    if HAS_RES:
        tl.store(res_ptr + offs, acc - deq, mask=g_ok[:, None])
    tl.store(q_ptr + offs, codes.to(q_ptr.dtype.element_ty), mask=g_ok[:, None])
    tl.store(s_ptr + g, scale * alpha, mask=g_ok)


@triton.jit
def _peer_base(table, peer, dtype: tl.constexpr):
    """Peer ``peer``'s buffer from a device table of uint64 addresses, as a ``dtype`` pointer
    (16-byte aligned, as symmetric allocations are: the hint lets loads and stores from it be
    vectorized, which a pointer loaded from memory otherwise never is)."""
    return tl.multiple_of(_peer_addr(table, peer).to(tl.pointer_type(dtype)), 16)


@triton.jit
def _peer_addr(table, peer):
    """Peer ``peer``'s buffer address (uint64, 16-byte aligned) from a device table."""
    return tl.multiple_of(tl.load(table.to(tl.pointer_type(tl.uint64)) + peer), 16)


@triton.jit
def epoch_barrier(
    pad_table, block_id, epoch, RANK: tl.constexpr, WORLD: tl.constexpr, WP2: tl.constexpr
):
    """Every rank's program ``block_id`` has reached barrier ``epoch`` (see the module's
    docstring); the stores this program made before it are visible to the peers after it, and
    theirs to this one."""
    tl.debug_barrier()  # this program's stores happen before its signals
    # The signals: one lane per peer, all sent at once. A store of the epoch, not a handshake:
    # a slot only grows, so a peer that is already one barrier further overwrites nothing its
    # waiter still needs (the waiter asks for >=). Triton issues a tensor atomic once per
    # element (threads holding copies of an element are masked off).
    p = tl.arange(0, WP2)
    pm = (p < WORLD) & (p != RANK)
    pp = tl.where(pm, p, RANK)  # masked lanes point at a valid table entry
    bases = tl.load(pad_table.to(tl.pointer_type(tl.uint64)) + pp)
    slots = bases.to(tl.pointer_type(tl.int32)) + block_id * WORLD + RANK
    tl.atomic_xchg(slots, tl.zeros((WP2,), dtype=tl.int32) + epoch, mask=pm, sem="release",
                   scope="sys")  # fmt: skip
    # The waits: scalar atomic reads (acquire), whose value Triton hands to every thread, so
    # that all threads leave the loop together. (A tensor atomic's result reaches only the
    # thread that issued it: the copies of an element would see 0 and spin.) Peer by peer: the
    # total wait is the last arrival's. Wrapping int32 difference: epochs count modulo 2^32.
    own = _peer_base(pad_table, RANK, tl.int32) + block_id * WORLD
    for q in tl.static_range(WORLD):
        if q != RANK:
            seen = tl.atomic_add(own + q, 0, sem="acquire", scope="sys")
            spins = 0
            # Bounded (SPIN_LIMIT, seconds): a dead peer leaves wrong results, not a hung GPU.
            while ((seen - epoch) < 0) & (spins < SPIN_LIMIT):
                seen = tl.atomic_add(own + q, 0, sem="acquire", scope="sys")
                spins += 1
    tl.debug_barrier()  # no thread reads peers' data before the signals arrived


@kernel(do_not_specialize=["epoch"])
def _barrier_kernel(pad_table, epoch, RANK: tl.constexpr, WORLD: tl.constexpr, WP2: tl.constexpr):
    # One program: what this rank's stream did before (copies into the peers' buffers) is
    # visible to every peer after it, and theirs to this rank.
    epoch_barrier(pad_table, 0, epoch, RANK, WORLD, WP2)


@triton.jit
def _sum_peers(x_ptr, buf_table, buf_off, offs, mask, RANK: tl.constexpr, WORLD: tl.constexpr):
    """float32 sum over ranks 0..WORLD-1, in that order on every rank (so every rank rounds
    alike); this rank's term read from its own input, the peers' from their buffers."""
    ty = x_ptr.dtype.element_ty
    acc = tl.zeros(offs.shape, dtype=tl.float32)
    for p in tl.static_range(WORLD):
        if p == RANK:
            v = tl.load(x_ptr + offs, mask=mask, other=0.0)
        else:
            peer = _peer_base(buf_table, p, ty) + buf_off
            v = tl.load(peer + offs, mask=mask, other=0.0, cache_modifier=".cv")
        acc += v.to(tl.float32)
    return acc


# ``epoch`` and ``buf_off`` change every call: never specialized (an epoch equal to 1 would
# otherwise compile a kernel of its own, and the cached launch would reuse it).
@kernel(do_not_specialize=["epoch", "buf_off"])
def _one_shot_kernel(
    x_ptr,  # (n,) this rank's input, contiguous
    out_ptr,  # (n,) the reduced output (may be x)
    buf_table,  # device table of the peers' symmetric buffers (>= buf_off + n elements each)
    pad_table,  # device table of the peers' signal pads (int32 slots)
    n,
    alpha,
    epoch,  # this call's barrier epoch (int32, wrapping)
    buf_off,  # the half of the symmetric buffers this call uses, in units of 16 elements
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    WP2: tl.constexpr,  # next power of 2 >= WORLD
    BLOCK: tl.constexpr,
    BARRIER: tl.constexpr,  # off only in the interpreter's test of the arithmetic
):
    # Copy in, one barrier, read and sum. No closing barrier: calls alternate between the two
    # halves of the buffers, and a rank rewrites a half only after every peer reached the
    # barrier of the call between, which it does only once its previous call (the readers of
    # that half) has finished.
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    # elements (passed in 16s: the loads and stores vectorize); int64: a half of a byte
    # buffer reaches 2^31 (a 1 GB compressed message's), which int32 would wrap
    buf_off = buf_off.to(tl.int64) * 16
    local = _peer_base(buf_table, RANK, x_ptr.dtype.element_ty) + buf_off
    start = pid.to(tl.int64) * BLOCK
    for base in range(start, n, step):
        offs = base + tl.arange(0, BLOCK)
        tl.store(local + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    if BARRIER:
        epoch_barrier(pad_table, pid, epoch, RANK, WORLD, WP2)
    for base in range(start, n, step):
        offs = base + tl.arange(0, BLOCK)
        acc = _sum_peers(x_ptr, buf_table, buf_off, offs, offs < n, RANK, WORLD)
        tl.store(out_ptr + offs, (acc * alpha).to(out_ptr.dtype.element_ty), mask=offs < n)


@kernel(do_not_specialize=["epoch", "buf_off"])
def _two_shot_kernel(
    x_ptr,  # (n,) this rank's input, contiguous
    out_ptr,  # (n,) the reduced output (may be x)
    buf_table,
    pad_table,
    n,
    alpha,
    epoch,  # the first of its two barriers' epochs
    buf_off,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    WP2: tl.constexpr,
    BLOCK: tl.constexpr,  # elements of a slice each rank reduces; a program's span is WORLD x
    BARRIER: tl.constexpr,
):
    # Reduce-scatter then all-gather through the buffers: rank r reduces part r of each span
    # (reading it from every peer) and writes the result into part r of every peer's buffer.
    # Two barriers; the closing one is free for the reason the one-shot gives.
    pid = tl.program_id(0)
    span = WORLD * BLOCK
    step = tl.num_programs(0).to(tl.int64) * span
    ty = x_ptr.dtype.element_ty
    buf_off = buf_off.to(tl.int64) * 16
    local = _peer_base(buf_table, RANK, ty) + buf_off
    start = pid.to(tl.int64) * span
    for base in range(start, n, step):
        for part in tl.static_range(WORLD):  # WORLD need not be a power of 2
            offs = base + part * BLOCK + tl.arange(0, BLOCK)
            tl.store(local + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    if BARRIER:
        epoch_barrier(pad_table, pid, epoch, RANK, WORLD, WP2)
    for base in range(start, n, step):
        offs = base + RANK * BLOCK + tl.arange(0, BLOCK)
        acc = _sum_peers(x_ptr, buf_table, buf_off, offs, offs < n, RANK, WORLD)
        acc = (acc * alpha).to(ty)
        for p in tl.static_range(WORLD):
            tl.store(_peer_base(buf_table, p, ty) + buf_off + offs, acc, mask=offs < n)
    if BARRIER:
        epoch_barrier(pad_table, pid, epoch + 1, RANK, WORLD, WP2)
    for base in range(start, n, step):
        for part in tl.static_range(WORLD):
            offs = base + part * BLOCK + tl.arange(0, BLOCK)
            v = tl.load(local + offs, mask=offs < n, cache_modifier=".cv")
            tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=offs < n)


@kernel(do_not_specialize=["epoch", "buf_off"])
def _all_reduce_add_rms_norm_kernel(
    x_ptr,  # (n_rows, H) this rank's partial sums, contiguous
    res_ptr,  # (n_rows, H) residual, contiguous
    w_ptr,  # (H,) weight (HAS_WEIGHT)
    out_ptr,  # (n_rows, H) normalized output
    res_out_ptr,  # (n_rows, H) new residual: all_reduce(x) + residual
    buf_table,
    pad_table,
    n_rows,
    H,
    eps,
    epoch,
    buf_off,
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    WP2: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BARRIER: tl.constexpr,
):
    # The tensor-parallel block's epilogue, rounded as tritonkit.add_rms_norm after a sum over
    # ranks in float32 rounded once to x's dtype (NCCL's ring rounds every hop: the same bits
    # at 2 ranks only).
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < H
    ty = x_ptr.dtype.element_ty
    buf_off = buf_off.to(tl.int64) * 16
    local = _peer_base(buf_table, RANK, ty) + buf_off
    for row in range(pid.to(tl.int64), n_rows, tl.num_programs(0)):
        offs = row * H + cols
        tl.store(local + offs, tl.load(x_ptr + offs, mask=cmask), mask=cmask)
    if BARRIER:
        epoch_barrier(pad_table, pid, epoch, RANK, WORLD, WP2)
    for row in range(pid.to(tl.int64), n_rows, tl.num_programs(0)):
        offs = row * H + cols
        acc = _sum_peers(x_ptr, buf_table, buf_off, offs, cmask, RANK, WORLD)
        h = acc.to(ty).to(tl.float32) + tl.load(res_ptr + offs, mask=cmask, other=0.0).to(
            tl.float32
        )
        tl.store(res_out_ptr + offs, h.to(res_out_ptr.dtype.element_ty), mask=cmask)
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / H + eps)
        y = h * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=cmask)


# ---- the compressed all-reduce on symmetric memory --------------------------------------------
# Each rank's buffer (bytes, in the call's half): WORLD incoming slots, ``chunk_bytes`` apart
# (slot s: rank s's quantized chunk of this rank's shard, codes then float32 scales), then
# WORLD reduced slots (slot s: rank s's reduced, requantized shard). Every transfer is a push: a
# rank stores into its peers' buffers (NVLink writes are posted; a peer read waits a round
# trip), and every load is of local memory. Only codes and scales cross NVLink.
#
# The work is cut into tiles of BLOCK_G blocks of the shard, the same on every rank, in three
# phases: quantize tile t of every chunk c and push it to rank c; reduce tile t of this rank's
# shard and push it to every rank; dequantize tile t of every reduced shard. The fused kernel
# runs all three in one launch: program b takes tiles b, b + P, ... in every phase and meets
# the peers' program b at a barrier between phases, which covers exactly the tiles it reads
# next (the peers' program b pushed them). Programs in different phases overlap NVLink pushes
# with local work.


@triton.jit
def _quantize_push_tile(
    x_ptr, res_ptr, buf_table, buf_off, n, blocks_per_shard, chunk_bytes, c, t,
    RANK: tl.constexpr, QMAX: tl.constexpr, B: tl.constexpr, BLOCK_G: tl.constexpr,
    HAS_RES: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    """Tile ``t`` of chunk ``c``: quantized (error feedback) into incoming slot RANK of rank
    ``c``'s buffer (``buf_off`` in bytes)."""
    g = (t * BLOCK_G + tl.arange(0, BLOCK_G)).to(tl.int64)  # blocks: int32 is enough
    j = tl.arange(0, B)
    g_ok = g < blocks_per_shard
    local = g[:, None] * B + j[None, :]
    offs = (c * blocks_per_shard + g)[:, None] * B + j[None, :]  # int64, as g is
    x = tl.load(x_ptr + offs, mask=g_ok[:, None] & (offs < n), other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(res_ptr + offs, mask=g_ok[:, None], other=0.0).to(tl.float32)
    codes, deq, scale = _quantize_blocks(x, QMAX, False, 0, 0, EMULATE)
    if HAS_RES:
        tl.store(res_ptr + offs, x - deq, mask=g_ok[:, None])
    dst = _peer_base(buf_table, c, tl.int8) + buf_off + RANK * chunk_bytes
    tl.store(dst + local, codes.to(tl.int8), mask=g_ok[:, None])
    scales = (dst + blocks_per_shard * B).to(tl.pointer_type(tl.float32))
    tl.store(scales + g, scale, mask=g_ok)


@triton.jit
def _reduce_push_tile(
    buf_table, res_ptr, buf_off, blocks_per_shard, chunk_bytes, alpha, t,
    RANK: tl.constexpr, WORLD: tl.constexpr, QMAX: tl.constexpr, B: tl.constexpr,
    BLOCK_G: tl.constexpr, HAS_RES: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    """Tile ``t`` of this rank's shard: its incoming slots dequantized, summed in float32 (ranks
    in order 0..WORLD-1), requantized (error feedback), pushed into reduced slot RANK of every
    rank's buffer with the scales times ``alpha``."""
    shard = blocks_per_shard * B
    g = (t * BLOCK_G + tl.arange(0, BLOCK_G)).to(tl.int64)  # blocks: int32 is enough
    j = tl.arange(0, B)
    g_ok = g < blocks_per_shard
    offs = g[:, None] * B + j[None, :]
    own = _peer_base(buf_table, RANK, tl.int8) + buf_off
    acc = tl.zeros((BLOCK_G, B), dtype=tl.float32)
    for s in tl.static_range(WORLD):
        # .cg: the peers' stores arrived in this GPU's L2; its L1 may hold an older call's
        base = own + s * chunk_bytes
        code = tl.load(base + offs, mask=g_ok[:, None], other=0, cache_modifier=".cg")
        scales = (base + shard).to(tl.pointer_type(tl.float32))
        scale = tl.load(scales + g, mask=g_ok, other=0.0, cache_modifier=".cg")
        acc += code.to(tl.float32) * scale[:, None]
    if HAS_RES:
        acc += tl.load(res_ptr + offs, mask=g_ok[:, None], other=0.0).to(tl.float32)
    codes, deq, scale = _quantize_blocks(acc, QMAX, False, 0, 0, EMULATE)
    if HAS_RES:
        tl.store(res_ptr + offs, acc - deq, mask=g_ok[:, None])
    codes = codes.to(tl.int8)
    scale = scale * alpha
    for p in tl.static_range(WORLD):
        dst = _peer_base(buf_table, (RANK + 1 + p) % WORLD, tl.int8) + buf_off
        dst += (WORLD + RANK) * chunk_bytes
        tl.store(dst + offs, codes, mask=g_ok[:, None])
        tl.store((dst + shard).to(tl.pointer_type(tl.float32)) + g, scale, mask=g_ok)


@triton.jit
def _dequant_tile(
    out_ptr, buf_table, buf_off, n, blocks_per_shard, chunk_bytes, c, t,
    RANK: tl.constexpr, WORLD: tl.constexpr, B: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    """Tile ``t`` of reduced slot ``c`` (rank c's reduced shard) dequantized into the output."""
    shard = blocks_per_shard * B
    g = (t * BLOCK_G + tl.arange(0, BLOCK_G)).to(tl.int64)  # blocks: int32 is enough
    j = tl.arange(0, B)
    g_ok = g < blocks_per_shard
    offs = g[:, None] * B + j[None, :]
    base = _peer_base(buf_table, RANK, tl.int8) + buf_off + (WORLD + c) * chunk_bytes
    dst = (c * blocks_per_shard + g)[:, None] * B + j[None, :]  # int64, as g is
    m = g_ok[:, None] & (dst < n)
    code = tl.load(base + offs, mask=m, other=0, cache_modifier=".cg")
    scales = (base + shard).to(tl.pointer_type(tl.float32))
    scale = tl.load(scales + g, mask=g_ok, other=0.0, cache_modifier=".cg")
    y = code.to(tl.float32) * scale[:, None]
    tl.store(out_ptr + dst, y.to(out_ptr.dtype.element_ty), mask=m)


# ``epoch`` and ``buf_off`` change every call: never specialized (nor ``blocks_per_shard``,
# which the kernel widens to int64: a specialized 1 would be a constant).
@kernel(do_not_specialize=["epoch", "buf_off", "blocks_per_shard"])
def _symm_compressed_kernel(
    x_ptr,  # (n,) input, contiguous
    out_ptr,  # (n,) the reduced output (may be x: a tile of x is read before it is written)
    res_ptr,  # error feedback (HAS_RES): (world * shard,) of the quantization, then (shard,) of
    # the requantization of this rank's shard
    buf_table,
    pad_table,
    n,
    blocks_per_shard,
    chunk_bytes,
    alpha,  # 1, or 1 / world for an average
    epoch,  # the first of its two barriers' epochs
    buf_off,  # the half of the buffers this call uses, in 16-byte units
    RANK: tl.constexpr,
    WORLD: tl.constexpr,
    WP2: tl.constexpr,
    QMAX: tl.constexpr,
    B: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HAS_RES: tl.constexpr,
    EMULATE: tl.constexpr,
    BARRIER: tl.constexpr,
    PHASES: tl.constexpr = 7,  # bits 1, 2, 4: quantize and push, reduce and push, dequantize
):
    # One launch runs all three phases; launches of one phase each (the same grid, epochs and
    # tiles) are the comparison's and the interpreter tests' (ranks in turn, barriers off).
    # No opening barrier: the peers last read this half two calls ago, and each of them
    # finished that call before any of its programs reached a barrier of the call between,
    # which this rank's programs all passed. Output tiles are written in the third phase, after
    # every rank's program b pushed tile t of chunk c: x's tile is no longer read by then.
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    tiles = tl.cdiv(blocks_per_shard, BLOCK_G)
    off = buf_off.to(tl.int64) * 16  # bytes: 2^31 and more in a large workspace
    sres_ptr = res_ptr
    if HAS_RES:
        sres_ptr += WORLD * B * blocks_per_shard.to(tl.int64)
    if PHASES & 1:
        for t in range(pid, tiles, progs):
            for k in tl.static_range(WORLD):  # the peers first: their pushes take longest
                _quantize_push_tile(x_ptr, res_ptr, buf_table, off, n, blocks_per_shard,
                                    chunk_bytes, (RANK + 1 + k) % WORLD, t, RANK, QMAX, B,
                                    BLOCK_G, HAS_RES, EMULATE)  # fmt: skip
    if PHASES & 2:
        if BARRIER:
            epoch_barrier(pad_table, pid, epoch, RANK, WORLD, WP2)
        for t in range(pid, tiles, progs):
            _reduce_push_tile(buf_table, sres_ptr, off, blocks_per_shard, chunk_bytes, alpha, t,
                              RANK, WORLD, QMAX, B, BLOCK_G, HAS_RES, EMULATE)  # fmt: skip
    if PHASES & 4:
        if BARRIER:
            epoch_barrier(pad_table, pid, epoch + 1, RANK, WORLD, WP2)
        for t in range(pid, tiles, progs):
            for c in tl.static_range(WORLD):
                _dequant_tile(out_ptr, buf_table, off, n, blocks_per_shard, chunk_bytes, c, t,
                              RANK, WORLD, B, BLOCK_G)  # fmt: skip
