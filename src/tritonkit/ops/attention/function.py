"""Attention's launchers by path, its torch.library ops, its autograd.Function and the public
functions ``attention`` (F.scaled_dot_product_attention's semantics) and ``attention_varlen``
(flash-attn's ``flash_attn_varlen_func``)."""

from __future__ import annotations

import inspect

import torch

from tritonkit._autocast import LOWER, autocast_dtype, cast, policy
from tritonkit.ops._core.plan import cached, validated
from tritonkit.ops._core.registry import apply, define_op, direct_call_allowed
from tritonkit.ops._core.validate import check_choice, check_operand, check_tensor
from tritonkit.ops.attention.backward import BackwardPlan, backward_plan
from tritonkit.ops.attention.config import (
    DECODE_MAX_QUERIES,
    UNPIPELINED_FWD,
    BwdConfig,
    Problem,
)
from tritonkit.ops.attention.decode import DecodePlan, decode_plan
from tritonkit.ops.attention.forward import ForwardPlan, forward_plan
from tritonkit.ops.attention.naive import launch_naive
from tritonkit.ops.attention.tiles import ADDITIVE_MASK, BOOL_MASK, NO_MASK
from tritonkit.ops.attention.validate import (
    DTYPES,
    MAX_HEAD_DIM,
    UnsupportedAttention,
    as_4d,
    check_cu,
    check_cu_values,
    check_dense,
    scalars,
    window_band,
)

VARIANTS = ("naive", "flash", "tuned")


def _mask_kind(mask: torch.Tensor | None) -> int:
    if mask is None:
        return NO_MASK
    return BOOL_MASK if mask.dtype == torch.bool else ADDITIVE_MASK


def _band(causal: bool, left: int, right: int) -> tuple[int, int]:
    """(left, right) with -1 for an unbounded side; causal caps the right side at 0."""
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def problem(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    cu_q: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    causal: bool,
    left: int,
    right: int,
) -> Problem:
    """The launch-relevant description of a dense (B, H, L, D) or packed (T, H, D) call."""
    left, right = _band(causal, left, right)
    varlen = cu_q is not None
    if varlen:
        batch, heads, kv_heads = cu_q.shape[0] - 1, q.shape[1], k.shape[1]
    else:
        batch, heads, kv_heads = q.shape[0], q.shape[1], k.shape[1]
    return Problem(
        batch, heads, kv_heads, max_q, max_k, q.shape[-1], q.dtype, _mask_kind(mask),
        left, right, varlen, varlen, dropout_p > 0,
    )  # fmt: skip


def _outputs(q: torch.Tensor, varlen: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """O in the (B, L, H, D) memory order SDPA's flash backend returns (transposed back to
    (B, H, L, D): ``o.transpose(1, 2).reshape(B, L, H * D)`` is then free), or packed like
    q; the fp32 base-2 lse, (B, H, L) or (H, T)."""
    if varlen:
        total, heads, _ = q.shape
        o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        return o, torch.empty((heads, total), device=q.device, dtype=torch.float32)
    b, h, n, d = q.shape
    # (B, L, H, D) memory read as (B, H, L, D): one allocation, no view op
    o = torch.empty_strided((b, h, n, d), (n * h * d, d, h * d, 1), device=q.device, dtype=q.dtype)
    return o, torch.empty((b, h, n), device=q.device, dtype=torch.float32)


def _mask_key(mask: torch.Tensor | None) -> tuple | None:
    return None if mask is None else (mask.shape, mask.stride(), mask.dtype)


class _Naive:
    """The workbench's naive path of one call key: its launcher runs at each call."""

    __slots__ = ("p", "scale")

    def __init__(self, p: Problem, scale: float) -> None:
        self.p, self.scale = p, scale

    def __call__(self, q, k, v, mask, cu_q, cu_k, rng):
        o, _ = _outputs(q, self.p.varlen)
        launch_naive(self.p, q, k, v, o, mask, self.scale)
        return o, None


def _forward_plan(q, k, v, mask, cu_q, cu_k, max_q, max_k, rng, dropout_p, scale, causal, left,
                  right, path, config) -> ForwardPlan | DecodePlan | _Naive:  # fmt: skip
    p = problem(q, k, mask, cu_q, max_q, max_k, dropout_p, causal, left, right)
    if path == "auto":
        decode = not p.varlen and not p.dropout and 0 < p.seq_q <= DECODE_MAX_QUERIES < p.seq_k
        path = "decode" if decode else "flash"
    if path == "naive":
        return _Naive(p, scale)
    o, lse = _outputs(q, p.varlen)
    if path == "decode" and p.seq_k > 0 and p.seq_q * p.batch * p.heads > 0:
        return decode_plan(p, q, k, v, o, lse, mask, scale, config)
    return forward_plan(p, q, k, v, o, lse, mask, cu_q, cu_k, rng, scale, dropout_p, config)


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    cu_q: torch.Tensor | None,
    cu_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    rng: torch.Tensor | None,
    dropout_p: float,
    scale: float,
    causal: bool,
    left: int,
    right: int,
    path: str = "auto",
    config=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, base-2 lse) along ``path``: "auto" (split-KV decoding for at most
    DECODE_MAX_QUERIES queries without dropout, else the flash kernel), "flash", "decode", or
    "naive" (three kernels, no lse: returned as None). ``config``: the path's Tile or
    DecodeGemmConfig (None: tuned). Inputs are validated by the public functions.

    What a call decides (problem, path, tile, grid, the kernel's specialization) depends on
    its shapes, strides, dtypes, device, scalars and Env only: planned once per key in the
    one plan cache, then a call allocates and launches (``forward.ForwardPlan``)."""
    if cu_q is not None and not q.is_cuda:
        # Here rather than in the public function: the values are known only to the real
        # implementation (torch.compile traces the public function on fake tensors).
        check_cu_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)
    key = (
        q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), v.shape, v.stride(),
        _mask_key(mask), None if cu_q is None else cu_q.shape, max_q, max_k, rng is None,
        dropout_p, scale, causal, left, right, path, config,
    )  # fmt: skip

    def build() -> ForwardPlan | DecodePlan | _Naive:
        return _forward_plan(
            q, k, v, mask, cu_q, cu_k, max_q, max_k, rng, dropout_p, scale, causal, left, right,
            path, config,
        )  # fmt: skip

    return cached("attention.forward", key, build)(q, k, v, mask, cu_q, cu_k, rng)


def attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    cu_q: torch.Tensor | None,
    cu_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    rng: torch.Tensor | None,
    dropout_p: float,
    scale: float,
    causal: bool,
    left: int,
    right: int,
    config: BwdConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in the layouts of q, k and v (``config``: None for the tuned tiles),
    planned once per key as the forward is (``backward.BackwardPlan``)."""
    key = (
        do.shape, do.stride(), q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(),
        v.shape, v.stride(), o.stride(), lse.shape, lse.stride(), _mask_key(mask),
        None if cu_q is None else cu_q.shape, max_q, max_k, rng is None, dropout_p, scale,
        causal, left, right, config,
    )  # fmt: skip

    def build() -> BackwardPlan:
        p = problem(q, k, mask, cu_q, max_q, max_k, dropout_p, causal, left, right)
        return backward_plan(
            p, do, q, k, v, o, lse, mask, cu_q, cu_k, rng, scale, dropout_p, config
        )

    return cached("attention.backward", key, build)(do, q, k, v, o, lse, mask, cu_q, cu_k, rng)


# ----------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------


def _op_launcher(fn):
    """``fn`` as an op's launcher: the signature (and so the schema) without its tuning
    arguments (``path``, ``config``), which the op never passes; written once, here."""
    signature = inspect.signature(fn)
    tuning = ("path", "config")
    params = [p for name, p in signature.parameters.items() if name not in tuning]

    def launcher(*args):
        return fn(*args)

    launcher.__signature__ = signature.replace(parameters=params)
    launcher.__name__ = launcher.__qualname__ = fn.__name__
    return launcher


_attention_fwd_op = define_op("tritonkit::attention_fwd")(_op_launcher(attention_forward))
_attention_bwd_op = define_op("tritonkit::attention_bwd")(_op_launcher(attention_backward))


@_attention_fwd_op.register_fake
def _(q, k, v, mask, cu_q, *rest):
    return _outputs(q, cu_q is not None)


@_attention_bwd_op.register_fake
def _(do, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def call_attention_fwd(q, k, v, mask, cu_q, cu_k, max_q, max_k, rng, dropout_p, scale, causal,
                       left, right):  # fmt: skip
    """The forward op's launcher, run directly where ``registry.direct_call_allowed`` allows it
    (as ``registry.eager_direct`` does, checking the tensor arguments only: the rule reads
    nothing else), else the op."""
    if direct_call_allowed((q, k, v, mask, cu_q, cu_k, rng)):
        return attention_forward(
            q, k, v, mask, cu_q, cu_k, max_q, max_k, rng, dropout_p, scale, causal, left, right
        )
    return _attention_fwd_op.overload(
        q, k, v, mask, cu_q, cu_k, max_q, max_k, rng, dropout_p, scale, causal, left, right
    )


def call_attention_bwd(do, q, k, v, o, lse, mask, cu_q, cu_k, max_q, max_k, rng, dropout_p,
                       scale, causal, left, right):  # fmt: skip
    """The backward op's launcher, run directly where allowed (as ``call_attention_fwd``)."""
    args = (do, q, k, v, o, lse, mask, cu_q, cu_k, max_q, max_k, rng, dropout_p, scale, causal,
            left, right)  # fmt: skip
    if direct_call_allowed((do, q, k, v, o, lse, mask, cu_q, cu_k, rng)):
        return attention_backward(*args)
    return _attention_bwd_op.overload(*args)


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------


def draw_rng(device: torch.device) -> torch.Tensor:
    """Dropout's Philox (seed, offset), drawn from torch's default generator of ``device`` as a
    device tensor: ``torch.manual_seed`` reproduces it, and under CUDA graph capture the draw
    is captured too, so each replay draws afresh and the kernels read it from memory."""
    return torch.randint(0, 2**62, (2,), device=device, dtype=torch.int64)


class AttentionFunction(torch.autograd.Function):
    """Attention with the FlashAttention-2 backward; saves Q, K, V, O and the row lse."""

    @staticmethod
    def forward(
        ctx, q, k, v, mask, cu_q, cu_k, max_q, max_k, dropout_p, scale, causal, left, right
    ):
        rng = draw_rng(q.device) if dropout_p > 0 else None
        o, lse = call_attention_fwd(
            q, k, v, mask, cu_q, cu_k, max_q, max_k, rng, dropout_p, scale, causal, left, right
        )
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, o, lse, mask, cu_q, cu_k, rng)
            ctx.args = (max_q, max_k, dropout_p, scale, causal, left, right)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, mask, cu_q, cu_k, rng = ctx.saved_tensors
        max_q, max_k, dropout_p, scale, causal, left, right = ctx.args
        dq, dk, dv = call_attention_bwd(
            do,
            q,
            k,
            v,
            o,
            lse,
            mask,
            cu_q,
            cu_k,
            max_q,
            max_k,
            rng,
            dropout_p,
            scale,
            causal,
            left,
            right,
        )
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------


@policy(cuda=LOWER, cpu=LOWER)
def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    window: tuple[int | None, int | None] | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, with autograd: FlashAttention-2 (the L x S scores
    never in memory), split-KV decoding for at most 16 queries, sliding windows.

    Args:
        query: (B, H, L, D) or (B, L, D); fp16, bf16 or fp32 on a CUDA device, any strides
            (the (B, L, H, D) layout transposed is read in place). D up to 256.
        key, value: (B, Hkv, S, D) (or 3-d), query's dtype; value's head dim must equal D.
            The batch dims of query, key and value broadcast as SDPA's matmuls broadcast them
            (shapes aligned from the right: a 3-d query with 4-d key/value is one batch whose
            heads are the query's first dim); a broadcast operand is read through stride 0,
            never copied, and its gradient is summed over the dims it was broadcast over.
            key and value may differ in heads only where one of them has 1.
        attn_mask: bool (True: attend) or additive float (float32 or query's dtype),
            broadcastable to (B, H, L, S) and read through its broadcast strides, never
            expanded in memory; key padding is (B, 1, 1, S). No gradient flows to it.
        dropout_p: probability of dropping an attention weight (applied whatever the module's
            training mode, as SDPA does). The mask comes from an in-kernel Philox generator
            whose seed and offset are drawn from torch's default generator of the device.
        is_causal: query i attends keys j <= i (SDPA's top-left alignment when L != S); may be
            combined with attn_mask and window (SDPA itself refuses a mask with is_causal).
        scale: score scale; None is 1 / sqrt(D).
        enable_gqa: allow Hkv < H with H % Hkv == 0 (query head h reads K/V head
            h // (H / Hkv), as SDPA's repeat_interleave); Hkv == 1 broadcasts as in SDPA.
        window: sliding window (left, right): query i attends keys i - left <= j <= i + right
            (the diagonal aligned as is_causal aligns it); None or -1 leaves a side unbounded.

    Returns:
        (B, H, L, D) (or (B, L, D)) in query's dtype, stored in (B, L, H, D) order. A row with
        no key to attend (fully masked) is 0 with zero gradients, as SDPA's math and CPU
        backends give (PyTorch >= 2.5). fp16/bf16 are multiplied on the tensor cores with fp32
        accumulation, the probabilities rounded to the input dtype before P @ V; fp32 inputs
        are multiplied in IEEE fp32 (TF32 where ``torch.backends.cuda.matmul.allow_tf32``).
        Under ``torch.autocast`` the inputs are cast to the autocast dtype, as SDPA's are.

    Raises:
        UnsupportedAttention (a ValueError): a call tritonkit does not run, SDPA's other
            backends may (fp64, a value head dim != D, D > 256, a mask needing a gradient,
            ...); the message names the argument, what is supported and what was given.
        TypeError, ValueError: invalid arguments, before anything is launched.
    """
    op = "tritonkit.attention"
    dt = autocast_dtype("attention", query)
    if dt is not None:
        query, key, value = cast(dt, query, key, value)
        if isinstance(attn_mask, torch.Tensor) and attn_mask.dtype != torch.bool:
            (attn_mask,) = cast(dt, attn_mask)
    args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window)
    views, mask_view, three_d, left, right, scale = validated(
        op, _dense_facts(*args), lambda: _check_attention(op, *args)
    )
    q, k, v, mask = query, key, value, attn_mask
    if views is not None:  # 3-d or broadcast operands: 4-d views (check_dense's)
        q, k, v = (as_4d(t, 3 if three_d else 4, shape) for t, shape in zip((q, k, v), views))
    if mask is not None:
        mask = mask.expand(mask_view)
        if three_d:
            mask = mask.unsqueeze(1)
    o = apply(
        AttentionFunction, q, k, v, mask, None, None, q.shape[2], k.shape[2],
        float(dropout_p), scale, is_causal, left, right,
    )  # fmt: skip
    return o.squeeze(1) if three_d else o


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _dense_facts(query, key, value, attn_mask, *scalars) -> tuple | None:
    """What ``_check_attention`` reads of a call (``plan.arg_facts``' key, with what the mask
    check reads besides: whether the mask needs a gradient under grad mode), or None: validate
    this call (while torch.compile traces, tensor subclasses, nested tensors, a list)."""
    if torch.compiler.is_compiling():
        return None
    facts = []
    for t in (query, key, value):
        if type(t) not in _PLAIN or t.is_nested:
            return None
        facts.append((t.shape, t.dtype, t.device))
    if attn_mask is not None:
        if type(attn_mask) not in _PLAIN or attn_mask.is_nested:
            return None
        grad = attn_mask.requires_grad and torch.is_grad_enabled()
        facts.append((attn_mask.shape, attn_mask.dtype, attn_mask.device, grad))
    for a in scalars:
        facts.append((type(a), a, tuple(map(type, a))) if type(a) is tuple else (type(a), a))
    key = tuple(facts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _check_attention(op, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                     window) -> tuple:  # fmt: skip
    """The verdict on a valid call (its checks raise on an invalid one): the 4-d shapes of
    q, k, v (None: they are 4-d as given), the mask's expanded shape, whether the call is 3-d,
    the band, the scale."""
    q, k, v, mask, three_d = check_dense(op, query, key, value, attn_mask, enable_gqa)
    left, right = window_band(op, window)
    scale = scalars(op, dropout_p, scale, q.shape[-1])
    if not isinstance(is_causal, bool):
        raise TypeError(f"{op}: is_causal must be a bool, got {type(is_causal).__name__}")
    pairs = ((query, q), (key, k), (value, v))
    same = all(a.dim() == 4 and a.shape == b.shape for a, b in pairs)
    views = None if same else (q.shape, k.shape, v.shape)
    mask_view = None
    if mask is not None:
        mask_view = mask.shape[:1] + mask.shape[2:] if three_d else mask.shape
    return views, mask_view, three_d, left, right, scale


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
) -> torch.Tensor:
    """Attention over a packed batch of sequences of different lengths, as flash-attn's
    ``flash_attn_varlen_func`` takes it: no padding is stored or computed.

    Args:
        q: (total_q, H, D), the batch's sequences one after another; fp16, bf16 or fp32 on a
            CUDA device, any strides. D up to 256.
        k, v: (total_k, Hkv, D) with H % Hkv == 0 (GQA/MQA), q's dtype.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,): sequence i is rows
            ``[cu[i], cu[i + 1])``. Each must start at 0, not decrease and end at its packed
            length (``q.shape[0]``, ``k.shape[0]``). Checked before anything is read: on the
            host for CPU tensors (ValueError); on CUDA by the forward kernel's device-side
            assert (reading them on the host would synchronize every call), which stops the
            kernel as PyTorch's own asserts do (the CUDA context is then unusable).
        max_seqlen_q, max_seqlen_k: at least the longest sequence (they size the grid);
            checked with cu_seqlens.
        dropout_p: as in ``attention``.
        softmax_scale: None is 1 / sqrt(D).
        causal: query i of a sequence attends keys j <= i + Sk - Sq (flash-attn's bottom-right
            alignment; rows with no key give 0).
        window: (left, right) around the same diagonal, -1 or None unbounded (flash-attn's
            ``window_size``).

    Returns:
        (total_q, H, D) in q's dtype, with autograd for q, k and v.
    """
    op = "tritonkit.attention_varlen"
    check_tensor(op, "q", q, DTYPES)
    for name, t in (("k", k), ("v", v)):
        check_operand(op, name, t, "q", q, dtypes=DTYPES)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(
                f"{op}: {name} must be 3-d (total, heads, head_dim), got shape {tuple(t.shape)}"
            )
    if k.shape != v.shape:
        raise ValueError(f"{op}: v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{op}: k's head dim must be q's ({q.shape[2]}), got {k.shape[2]}")
    if q.shape[2] > MAX_HEAD_DIM:
        raise UnsupportedAttention(
            f"{op}: q's head dim must be at most {MAX_HEAD_DIM}, got {q.shape[2]} (not supported)"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{op}: k/v heads ({k.shape[1]}) must divide q heads ({q.shape[1]})")
    cu_q = check_cu(op, "cu_seqlens_q", cu_seqlens_q, q)
    cu_k = check_cu(op, "cu_seqlens_k", cu_seqlens_k, q)
    if cu_q.shape != cu_k.shape:
        raise ValueError(
            f"{op}: cu_seqlens_k must have cu_seqlens_q's length {cu_q.shape[0]}, "
            f"got {cu_k.shape[0]}"
        )
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{op}: {name} must be an int >= 0, got {n!r}")
    # What the shapes alone tell: packed rows and no sequence, or sequences of 0 rows at most
    # (no kernel would run to check the values on the device).
    for rows, t, cu_name, cu, max_name, longest in (
        ("q", q, "cu_seqlens_q", cu_q, "max_seqlen_q", max_seqlen_q),
        ("k", k, "cu_seqlens_k", cu_k, "max_seqlen_k", max_seqlen_k),
    ):
        if t.shape[0] and cu.shape[0] == 1:
            raise ValueError(
                f"{op}: {cu_name} must hold one sequence or more (length >= 2) for {rows}'s "
                f"{t.shape[0]} packed rows, got length 1"
            )
        if t.shape[0] and longest == 0:
            raise ValueError(
                f"{op}: {max_name} must be at least 1 for {rows}'s {t.shape[0]} packed rows, got 0"
            )
    left, right = window_band(op, window)
    scale = scalars(op, dropout_p, softmax_scale, q.shape[2], "softmax_scale")
    return apply(
        AttentionFunction, q, k, v, None, cu_q, cu_k, max_seqlen_q, max_seqlen_k,
        float(dropout_p), scale, bool(causal), left, right,
    )  # fmt: skip


def attention_variant(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    window: tuple[int | None, int | None] | None = None,
    variant: str = "naive",
) -> torch.Tensor:
    """The forward alone along a workbench variant: "naive" (three kernels, scores in memory),
    "flash" (the flash kernel without software pipelining), "tuned" (the tuned kernel)."""
    op = f"tritonkit.attention[{variant}]"
    check_choice(op, "variant", variant, VARIANTS)
    q, k, v, mask, three_d = check_dense(op, query, key, value, attn_mask, enable_gqa)
    left, right = window_band(op, window)
    scale = scalars(op, dropout_p, scale, q.shape[-1])
    if dropout_p:
        raise UnsupportedAttention(f"{op}: the workbench variants have no dropout")
    path, config = {
        "naive": ("naive", None),
        "flash": ("flash", UNPIPELINED_FWD),
        "tuned": ("flash", None),
    }[variant]
    o, _ = attention_forward(
        q, k, v, mask, None, None, q.shape[2], k.shape[2], None, 0.0, scale, is_causal, left, right,
        path, config,
    )  # fmt: skip
    return o.squeeze(1) if three_d else o
