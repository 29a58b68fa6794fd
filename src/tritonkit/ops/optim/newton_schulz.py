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

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonkit import _tuning
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.gemm import mac, mainloop_ptr, tile_coords
from tritonkit.ops._core.launch import kernel
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.plan import cached
from tritonkit.ops.matmul import matmul

try:  # host-side TMA descriptors (triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer kernel serves everything
    TensorDescriptor = None

# torch.optim.Muon's defaults (Keller Jordan's quintic iteration).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


PRODUCTS = ("fused", "matmul")


@dataclass(frozen=True)
class NSConfig:
    """Tiles of the Newton-Schulz GEMM: square ``block_sym`` tiles for the symmetric products,
    ``block_m x block_n`` for the third; and how the third product runs: ``"fused"``, this
    module's kernel with the ``a X + B X`` epilogue (PyTorch's rounding), or ``"matmul"``,
    ``tritonkit.matmul`` on ``B' = a I + B`` (the identity folded into B's epilogue, which
    rounds B's diagonal with ``a`` in it). ``tma``: operands through TMA tensor descriptors
    instead of pointer loads where the device has them (Hopper) and every operand's rows are
    16-byte aligned; elsewhere the pointer kernel runs with the same tiles."""

    product: str = "fused"
    tma: bool = False
    block_sym: int = 128
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3

    def tuning(self) -> _tuning.Config:
        params = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        params["product"] = PRODUCTS.index(self.product)
        params["tma"] = int(self.tma)
        warps, stages = params.pop("num_warps"), params.pop("num_stages")
        return _tuning.Config(params, warps, stages)

    @staticmethod
    def from_tuning(cfg: _tuning.Config) -> NSConfig:
        params = dict(cfg.params)
        params.pop("group_m", None)  # a row written while the tile order was a field (always 8)
        params["product"] = PRODUCTS[int(params["product"])]
        params["tma"] = bool(params["tma"])
        return NSConfig(**params, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


DEFAULT_NS = NSConfig()
INTERPRETER_NS = NSConfig(
    block_sym=32, block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=1
)
# Hopper's heuristic configs: operands through TMA; the third product's tiles 128 x 256 where
# that still gives every SM a tile, else 128 x 128.
HOPPER_NS = NSConfig(tma=True)
HOPPER_WIDE_NS = NSConfig(tma=True, block_n=256)
# The configs a shipped table may name (experiments/gpu_optim_defaults.py times them all).
NS_CANDIDATES = (
    DEFAULT_NS,
    HOPPER_NS,
    NSConfig(block_n=256),
    HOPPER_WIDE_NS,
    NSConfig(tma=True, num_stages=4),
    NSConfig(num_warps=4, num_stages=4),
    NSConfig(block_sym=64),
    NSConfig(block_k=128, num_stages=2),
    NSConfig(product="matmul"),
    NSConfig(product="matmul", tma=True),
)
NS_KERNEL = "optim.newton_schulz"  # the shipped tables' name for this choice (a cache key)
# Row blocks per group of the grouped tile order (L2 reuse), the same for every config: no
# sweep varied it.
NS_GROUP_M = 8


def default_ns_config() -> NSConfig:
    """The config of no particular shape or device (the interpreter's, or the pointer kernel's
    128 x 128 tiles); ``choose_ns_config`` picks one for a batch."""
    return INTERPRETER_NS if interpreter_enabled() else DEFAULT_NS


def tma_device(device: torch.device) -> bool:
    """Whether TMA descriptors can be used on ``device`` (Hopper or later; the interpreter
    runs them too)."""
    if interpreter_enabled():
        return TensorDescriptor is not None
    if TensorDescriptor is None or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def heuristic_ns_config(n_batch: int, rows: int, cols: int, device: torch.device) -> NSConfig:
    """Where no table says otherwise: the pointer kernel's 128 x 128 tiles, or on Hopper the
    TMA kernel, with 128 x 256 tiles for the third product (whose output is s x n or n x s,
    s = min(rows, cols), n = max(rows, cols)) when the batch still has a tile for every SM."""
    if interpreter_enabled():
        return INTERPRETER_NS
    if not tma_device(device):
        return DEFAULT_NS
    s, n = min(rows, cols), max(rows, cols)
    tiles = n_batch * cdiv(s, HOPPER_WIDE_NS.block_m) * cdiv(n, HOPPER_WIDE_NS.block_n)
    return HOPPER_WIDE_NS if tiles >= sm_count(device) else HOPPER_NS


def ns_key(n_batch: int, rows: int, cols: int) -> dict[str, int]:
    """What the choice depends on: the matrix as iterated (s x n, s <= n) and the batch's
    power-of-two class."""
    return {"s": min(rows, cols), "n": max(rows, cols), "batch": next_power_of_2(n_batch)}


def choose_ns_config(n_batch: int, rows: int, cols: int, device: torch.device) -> NSConfig:
    """The Newton-Schulz config for a batch of ``n_batch`` ``rows x cols`` matrices: this
    GPU's shipped table (``tuned/<gpu>/optim.json``) where it has the shape and tables are
    read (``TRITONKIT_AUTOTUNE`` unset or 0), else ``heuristic_ns_config``. Nothing is timed
    in a step."""
    fallback = heuristic_ns_config(n_batch, rows, cols, device)
    if device.type != "cuda" or not _tuning.consulted() or _tuning.mode() == "1":
        return fallback
    key = ns_key(n_batch, rows, cols)

    def choose() -> NSConfig:
        with torch.cuda.device(device):
            row = _tuning.shipped_lookup(NS_KERNEL, key)
        if row is None or row not in [c.tuning() for c in NS_CANDIDATES]:
            return fallback
        config = NSConfig.from_tuning(row)
        return config if not config.tma or tma_device(device) else fallback

    return cached(NS_KERNEL, (device.index, *key.items()), choose)


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


def _natural(t: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """(a row-major view, whether t is its transpose) for a TMA descriptor, or None."""
    for view, trans in ((t, False), (t.transpose(1, 2), True)):
        st = view.stride()
        aligned = (st[1] * 2) % 16 == 0 and (st[0] * 2) % 16 == 0 and view.data_ptr() % 16 == 0
        if st[2] == 1 and aligned:
            return view, trans
    return None


def _desc(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, cols])


def _ns_gemm_tma(a, b, c, out, alpha, beta, diag, symmetric, block_m, block_n, grid, config):
    """The TMA kernel, if every operand has a descriptor layout; returns whether it ran."""
    views = [_natural(t) for t in (a, b, out if c is None else c, out)]
    if TensorDescriptor is None or any(v is None for v in views) or views[2][1] or views[3][1]:
        return False
    (a_nat, a_t), (b_nat, b_t), (c_nat, _), (o_nat, _) = views
    bk = config.block_k
    _ns_gemm_tma_kernel[grid](
        _desc(a_nat, bk, block_m) if a_t else _desc(a_nat, block_m, bk),
        _desc(b_nat, block_n, bk) if b_t else _desc(b_nat, bk, block_n),
        _desc(c_nat, block_m, block_n),
        _desc(o_nat, block_m, block_n),
        a.shape[1], b.shape[2], a.shape[2],
        alpha, beta, diag,
        A_TRANS=a_t, B_TRANS=b_t,
        SYMMETRIC=symmetric, HAS_C=c is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk,
        GROUP_M=NS_GROUP_M, UPCAST=interpreter_enabled(),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return True


def ns_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    out: torch.Tensor,
    alpha: float,
    beta: float,
    symmetric: bool,
    config: NSConfig,
    diag: float = 0.0,
) -> None:
    """``out = alpha * (a @ b) + beta * c + diag * I`` over a batch (3-D views, any strides); with
    ``symmetric`` the caller promises that the product is symmetric (``b`` holds ``a``
    transposed), and only the lower triangle's tiles are computed."""
    n_batch, m, k = a.shape
    n = b.shape[2]
    if symmetric:
        block_m = block_n = config.block_sym
        tiles = cdiv(m, block_m)
        grid = (tiles * (tiles + 1) // 2, n_batch)
    else:
        block_m, block_n = config.block_m, config.block_n
        grid = (cdiv(m, block_m) * cdiv(n, block_n), n_batch)
    tma = config.tma and tma_device(a.device)
    if tma and _ns_gemm_tma(
        a, b, c, out, alpha, beta, diag, symmetric, block_m, block_n, grid, config
    ):
        return
    cc = out if c is None else c
    _ns_gemm_kernel[grid](
        a, b, cc, out,
        m, n, k,
        *a.stride(), *b.stride(), *cc.stride(), *out.stride(),
        alpha, beta, diag,
        SYMMETRIC=symmetric,
        HAS_C=c is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=config.block_k,
        GROUP_M=NS_GROUP_M,
        EVEN_K=k % config.block_k == 0,
        UPCAST=interpreter_enabled(),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip


class NSWorkspace:
    """The buffers of one batch of same-shape matrices: X and its next iterate (``rows x
    cols``), the Gram matrix A and the polynomial B (``s x s``, s = min(rows, cols)), bf16."""

    def __init__(self, n_batch: int, rows: int, cols: int, device: torch.device) -> None:
        s = min(rows, cols)
        self.rows, self.cols = rows, cols
        self.x = torch.empty((n_batch, rows, cols), dtype=torch.bfloat16, device=device)
        self.x_next = torch.empty_like(self.x)
        self.gram = torch.empty((n_batch, s, s), dtype=torch.bfloat16, device=device)
        self.poly = torch.empty_like(self.gram)

    def result(self, steps: int) -> torch.Tensor:
        """The buffer that holds X after ``steps`` iterations (they alternate)."""
        return self.x if steps % 2 == 0 else self.x_next


def newton_schulz_(
    ws: NSWorkspace,
    steps: int,
    coefficients: tuple[float, float, float],
    config: NSConfig,
) -> torch.Tensor:
    """Run ``steps`` iterations on ``ws.x`` (already normalized); returns ``ws.result(steps)``.

    Per iteration: A = X X^T (symmetric), B = c A A + b A (symmetric), X' = a X + B X (wide)
    or a X + X B (tall, where the Gram matrix is X^T X), 3 launches for the whole batch.
    """
    a_coef, b_coef, c_coef = coefficients
    tall = ws.rows > ws.cols
    fused = config.product == "fused"
    cur, nxt = ws.x, ws.x_next
    for _ in range(steps):
        xs = cur.transpose(1, 2) if tall else cur
        ns_gemm(xs, xs.transpose(1, 2), None, ws.gram, 1.0, 0.0, True, config)
        # A is exactly symmetric (mirrored), so A A = A A^T: read A row-major as the B operand.
        diag = 0.0 if fused else a_coef
        ns_gemm(ws.gram, ws.gram, ws.gram, ws.poly, c_coef, b_coef, True, config, diag)
        if fused:
            a_op, b_op = (cur, ws.poly) if tall else (ws.poly, cur)
            ns_gemm(a_op, b_op, cur, nxt, 1.0, a_coef, False, config)
        else:
            nxt = matmul(cur, ws.poly) if tall else matmul(ws.poly, cur)
        cur, nxt = nxt, cur
    out = ws.result(steps)
    if cur is not out:  # "matmul" returns new tensors: the result goes where callers look
        out.copy_(cur)
    return out
