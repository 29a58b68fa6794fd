"""Newton-Schulz orthogonalization (Muon's core), batched over same-shape matrices.

``torch.optim.Muon`` runs, per matrix X (bfloat16, Frobenius-normalized, the wide way round),
``ns_steps`` times::

    A = X @ X.T;  B = b * A + c * (A @ A);  X = a * X + B @ X

Two of the three products are symmetric: ``X @ X.T`` and, A being symmetric, ``A @ A =
A @ A.T``. One kernel computes all three: with ``SYMMETRIC`` its programs cover only the tiles
on and below the diagonal and each also stores its tile's transpose above it, which halves
those products' FLOPs (a third of the iteration's); its epilogue is ``alpha * acc + beta * C``
(the ``addmm`` of PyTorch's code, rounded once to bfloat16 as cuBLAS rounds it). Every
matrix of a batch is one grid row (program id 1), so same-shape parameters share one launch
per product. A tall X (rows > cols) is never transposed in memory: the products read it
through swapped strides (``X.T @ X``, ``X @ B``), which is the same iteration on X.T.

The K loop and the tile order are ``ops/_core/gemm.py``'s (``mainloop_ptr``, ``mac``,
``tile_coords``); what is new here is the triangle, the mirrored store and the ``addmm``
epilogue, and a TMA variant over 3-D (batch, rows, cols) descriptors (``NSConfig.tma``).

Under the CPU interpreter, where ``tl.dot`` on bfloat16 is wrong, tiles are upcast to float32
before the product (``UPCAST``): bfloat16 products are exact in float32, so the result is
what the GPU's bfloat16 tensor cores with float32 accumulation compute.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonkit.ops._core.gemm import mac, mainloop_ptr, tile_coords
from tritonkit.ops._core.launch import kernel

try:  # host-side TMA descriptors (triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer kernel serves everything
    TensorDescriptor = None


@triton.jit
def _lower_tile(pid):
    """Tile (i, j), j <= i, of the lower triangle, numbered row by row: pid = i(i+1)/2 + j."""
    i = ((tl.sqrt(8.0 * pid.to(tl.float32) + 1.0) - 1.0) * 0.5).to(tl.int32)
    i = tl.where(i * (i + 1) // 2 > pid, i - 1, i)  # the float estimate may be one off
    i = tl.where((i + 1) * (i + 2) // 2 <= pid, i + 1, i)
    return i, pid - i * (i + 1) // 2


@kernel
def _ns_gemm_kernel(
    a_ptr, b_ptr, c_ptr, out_ptr,  # batched operands: out = alpha * (a @ b) + beta * c
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_ob, stride_om, stride_on,
    alpha, beta, diag,  # out = alpha * (a @ b) + beta * c + diag * I
    SYMMETRIC: tl.constexpr,  # a @ b is symmetric: lower-triangle tiles, each stored twice
    HAS_C: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask in the K loop
    UPCAST: tl.constexpr,  # float32 products (the interpreter's bfloat16 dot is wrong)
):  # fmt: skip
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    if SYMMETRIC:
        tm, tn = _lower_tile(pid)
    else:
        tm, tn = tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc, _ = mainloop_ptr(
        a_ptr + batch * stride_ab, b_ptr + batch * stride_bb,
        tm * BLOCK_M, tn * BLOCK_N, 0, K, M, N, stride_am, stride_ak, stride_bk, stride_bn,
        acc, acc, True, "ieee", None, 1, UPCAST, EVEN_K, False, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    rm = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = rm < M
    in_n = rn < N
    out = acc * alpha
    if HAS_C:
        c_ptrs = c_ptr + batch * stride_cb + rm[:, None] * stride_cm + rn[None, :] * stride_cn
        c = tl.load(c_ptrs, mask=in_m[:, None] & in_n[None, :], other=0.0)
        out += beta * c.to(tl.float32)
    out += tl.where(rm[:, None] == rn[None, :], diag, 0.0)
    out = out.to(tl.bfloat16)
    o_ptrs = out_ptr + batch * stride_ob + rm[:, None] * stride_om + rn[None, :] * stride_on
    tl.store(o_ptrs, out, mask=in_m[:, None] & in_n[None, :])
    if SYMMETRIC:  # noqa: SIM102 (a constexpr test, resolved when the kernel compiles)
        if tm != tn:  # the mirror tile, transposed in registers so that the store coalesces
            t_ptrs = out_ptr + batch * stride_ob + rn[:, None] * stride_om + rm[None, :] * stride_on
            tl.store(t_ptrs, tl.trans(out), mask=in_n[:, None] & in_m[None, :])


@triton.jit
def _tile_load(desc, batch, row, col, R: tl.constexpr, C: tl.constexpr, TRANS: tl.constexpr):
    """The (R, C) tile at (row, col) of an operand; with TRANS, of its transpose (the
    descriptor then holds the operand's natural, row-major layout)."""
    if TRANS:
        return tl.trans(desc.load([batch, col, row]).reshape(C, R))
    return desc.load([batch, row, col]).reshape(R, C)


@kernel
def _ns_gemm_tma_kernel(
    a_desc, b_desc, c_desc, out_desc,  # 3-D descriptors over row-major (batch, rows, cols)
    M, N, K,
    alpha, beta, diag,  # out = alpha * (a @ b) + beta * c + diag * I
    A_TRANS: tl.constexpr, B_TRANS: tl.constexpr,  # the operand is the descriptor's transpose
    SYMMETRIC: tl.constexpr, HAS_C: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``_ns_gemm_kernel`` with operands through TMA: loads past an edge read zeros and
    stores past it are dropped, so no masks."""
    pid = tl.program_id(0)
    batch = tl.program_id(1)
    if SYMMETRIC:
        tm, tn = _lower_tile(pid)
    else:
        tm, tn = tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    om = tm * BLOCK_M
    on = tn * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = _tile_load(a_desc, batch, om, k * BLOCK_K, BLOCK_M, BLOCK_K, A_TRANS)
        b = _tile_load(b_desc, batch, k * BLOCK_K, on, BLOCK_K, BLOCK_N, B_TRANS)
        acc = mac(a, b, acc, True, "ieee", None, UPCAST)
    out = acc * alpha
    if HAS_C:
        out += beta * c_desc.load([batch, om, on]).reshape(BLOCK_M, BLOCK_N).to(tl.float32)
    rm = om + tl.arange(0, BLOCK_M)
    rn = on + tl.arange(0, BLOCK_N)
    out += tl.where(rm[:, None] == rn[None, :], diag, 0.0)
    out = out.to(tl.bfloat16)
    out_desc.store([batch, om, on], out.reshape(1, BLOCK_M, BLOCK_N))
    if SYMMETRIC:  # noqa: SIM102 (a constexpr test, resolved when the kernel compiles)
        if tm != tn:
            out_desc.store([batch, on, om], tl.trans(out).reshape(1, BLOCK_N, BLOCK_M))
