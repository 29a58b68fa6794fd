"""Attention family: the check engine, every mask / window / GQA / varlen / causal (L != S) /
dropout combination against a float64 reference, tile configs crossing every block edge,
split-KV decoding, the workbench variants, validation, the SDPA patch, torch.compile.

Shapes stay small (L, S <= ~70): every kernel runs under Triton's CPU interpreter here."""

import itertools
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import tritonkit
from tritonkit.nn import sdpa_patch
from tritonkit.ops.attention import (
    BwdConfig,
    DecodeGemmConfig,
    Tile,
    UnsupportedAttention,
    attention_backward,
    attention_forward,
    attention_variant,
)
from tritonkit.ops.attention.forward import _attn_fwd_kernel
from tritonkit.ops.attention.function import draw_rng
from tritonkit.specs.attention import sdpa_reference

from _checks import assert_spec_passes, compile_backend, saved_tensors

# Rows with no visible key reduce to -inf maxima: the interpreter's NumPy warns about them.
pytestmark = [
    pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm().clamp(min=1e-300)).item()


# Relative L2 bounds against float64 for fp16 inputs of unit variance: the outputs carry
# a few units in fp16's last place (2**-11 = 4.9e-4) from rounding P (and dS) as the tensor
# cores take them; measured 2e-4 to 4e-4 at these shapes.
FWD_BOUND = 1.5e-3
GRAD_BOUND = 3e-3


def _qkv(b, h, h_kv, n_q, n_k, d, device, dtype=torch.float16, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=g, device=device).to(dtype)
    k = torch.randn(b, h_kv, n_k, d, generator=g, device=device).to(dtype)
    v = torch.randn(b, h_kv, n_k, d, generator=g, device=device).to(dtype)
    return q, k, v


def _forward_and_grads(fn, q, k, v, do, *args, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v, *args, **kwargs)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def _assert_matches_reference(q, k, v, mask=None, causal=False, window=None, scale=None, seed=0):
    """tritonkit.attention's O, dQ, dK, dV against the float64 reference."""
    gqa = q.shape[-3] != k.shape[-3]
    do = torch.randn(
        q.shape, generator=torch.Generator(q.device).manual_seed(seed + 1), device=q.device
    )
    do = do.to(q.dtype)
    ours = _forward_and_grads(
        tritonkit.attention, q, k, v, do, mask, 0.0, causal, scale, gqa, window
    )
    up = [t.double() for t in (q, k, v)]
    m64 = mask.double() if mask is not None and mask.is_floating_point() else mask
    ref = _forward_and_grads(sdpa_reference, *up, do.double(), m64, 0.0, causal, scale, gqa, window)
    bounds = (FWD_BOUND, GRAD_BOUND, GRAD_BOUND, GRAD_BOUND)
    for name, a, r, bound in zip(["o", "dq", "dk", "dv"], ours, ref, bounds):
        assert a.shape == r.shape and a.dtype == q.dtype, name
        assert _rel(a, r) < bound, f"{name}: relative L2 error {_rel(a, r):.3g}"


# ---- the check engine ---------------------------------------------------------------------------


@pytest.mark.slow  # the fast tier: one check per public function in test_public_api
@pytest.mark.parametrize("name", ["attention", "attention_varlen"])
def test_check_engine_passes_fp16(name, device):
    """Every test shape (masks, windows, GQA, D = 96, decoding, packed batches) in fp16:
    random, non-contiguous, NaN/inf, gradients, empty."""
    assert_spec_passes(name, device, dtypes=[torch.float16])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["attention", "attention_varlen"])
def test_check_engine_passes_fp32_bf16(name, device):
    """fp32 (IEEE dots) and bf16 (under the interpreter: the operands upcast to fp32, since
    its bf16 tl.dot is wrong)."""
    assert_spec_passes(name, device, dtypes=[torch.float32, torch.bfloat16])


# ---- masks, windows, causal, GQA --------------------------------------------------------------


@pytest.mark.parametrize(
    "n_q, n_k, causal, window",
    [
        (37, 37, True, None),
        (45, 23, True, None),  # L > S: SDPA's top-left diagonal
        (19, 50, True, None),  # L < S
        (40, 40, False, (7, None)),  # left only
        (40, 33, False, (None, 4)),  # right only
        (29, 48, False, (3, 9)),
        (48, 29, True, (11, None)),  # causal sliding window, L != S
        (33, 33, True, (1, 0)),  # the diagonal and one key left of it
    ],
)
def test_causal_and_windows(n_q, n_k, causal, window, device):
    _assert_matches_reference(*_qkv(2, 2, 2, n_q, n_k, 32, device), causal=causal, window=window)


@pytest.mark.parametrize(
    "mask_shape, kind",
    [
        ((2, 1, 1, 41), "bool"),  # key padding
        ((2, 1, 23, 41), "bool"),
        ((23, 41), "bool"),  # broadcast over batch and heads
        ((2, 4, 23, 41), "float32"),  # additive, fp32 beside fp16 inputs
        ((1, 4, 1, 41), "float16"),  # additive, query's dtype
    ],
)
def test_masks(mask_shape, kind, device):
    q, k, v = _qkv(2, 4, 2, 23, 41, 32, device)
    g = torch.Generator(device=device).manual_seed(5)
    if kind == "bool":
        mask = torch.rand(mask_shape, generator=g, device=device) > 0.25
    else:
        mask = torch.randn(mask_shape, generator=g, device=device).to(getattr(torch, kind))
    _assert_matches_reference(q, k, v, mask=mask)


def test_mask_combined_with_causal_and_window(device):
    q, k, v = _qkv(1, 2, 1, 31, 44, 32, device)
    mask = torch.rand(1, 1, 31, 44, device=device) > 0.3
    _assert_matches_reference(q, k, v, mask=mask, causal=True, window=(9, None))
    bias = torch.randn(1, 2, 31, 44, device=device)
    _assert_matches_reference(q, k, v, mask=bias, window=(4, 6))


def test_fully_masked_rows_are_zero_with_zero_gradients(device):
    """As SDPA's math and CPU backends give (PyTorch >= 2.5): 0, not NaN."""
    q, k, v = _qkv(1, 2, 2, 9, 20, 16, device)
    mask = torch.ones(1, 1, 9, 20, dtype=torch.bool, device=device)
    mask[..., 4, :] = False
    o, dq, dk, dv = _forward_and_grads(tritonkit.attention, q, k, v, torch.ones_like(q), mask)
    assert torch.all(o[:, :, 4] == 0) and torch.all(dq[:, :, 4] == 0)
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), mask)
    assert torch.all(ref[:, :, 4] == 0)
    _assert_matches_reference(q, k, v, mask=mask)
    # a window that leaves rows without keys (S < L with the diagonal at the top left)
    _assert_matches_reference(*_qkv(1, 1, 1, 30, 12, 16, device), window=(0, 2))


@pytest.mark.parametrize("h, h_kv, gqa", [(6, 2, True), (4, 1, True), (4, 1, False)])
def test_gqa_and_mqa(h, h_kv, gqa, device):
    """enable_gqa reads K/V head h // (H / Hkv); one K/V head also broadcasts without it."""
    q, k, v = _qkv(2, h, h_kv, 21, 34, 32, device)
    o = tritonkit.attention(q, k, v, enable_gqa=gqa)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    assert _rel(o, ref) < FWD_BOUND
    _assert_matches_reference(q, k, v, causal=True)


@pytest.mark.parametrize("d", [40, 64, 96])
def test_head_dims_padded_to_a_power_of_2(d, device):
    _assert_matches_reference(*_qkv(1, 2, 2, 19, 27, d, device), causal=True)


@pytest.mark.slow
@pytest.mark.parametrize("d", [128, 256])
def test_large_head_dims(d, device):
    _assert_matches_reference(*_qkv(1, 1, 1, 17, 20, d, device))


def test_strided_layouts_read_in_place(device):
    """(B, L, H, D) transposed, and a slice of a fused QKV projection, without copies; O is
    stored in (B, L, H, D) order like SDPA's flash backend."""
    b, n, h, d = 2, 26, 3, 32
    qkv = torch.randn(b, n, 3, h, d, device=device).half()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    o = tritonkit.attention(q, k, v, is_causal=True)
    assert o.transpose(1, 2).is_contiguous()
    _assert_matches_reference(q, k, v, causal=True)
    # head dim with a non-unit stride
    qt = torch.randn(b, h, d, n, device=device).half().transpose(-1, -2)
    _assert_matches_reference(qt, k, v)


def test_three_d_inputs_and_scale(device):
    q, k, v = (t[:, 0] for t in _qkv(3, 1, 1, 14, 22, 32, device))
    o = tritonkit.attention(q, k, v, scale=0.3)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.3)
    assert o.shape == q.shape and _rel(o, ref) < FWD_BOUND
    mask = torch.rand(3, 14, 22, device=device) > 0.2
    o = tritonkit.attention(q, k, v, mask)
    assert (
        _rel(o, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), mask))
        < FWD_BOUND
    )


# (query, key, value) shapes whose batch dims broadcast, as SDPA's matmuls broadcast them
# (shapes aligned from the right), and enable_gqa.
BROADCASTS = [
    ((4, 9, 16), (4, 4, 13, 16), (4, 4, 13, 16), False),  # 3-d query: its dim 0 is the heads
    ((2, 4, 9, 16), (4, 13, 16), (4, 13, 16), False),  # 3-d key/value under a 4-d query
    ((1, 4, 9, 16), (3, 4, 13, 16), (1, 4, 13, 16), False),  # batch 1 in query and value
    ((3, 1, 9, 16), (3, 4, 13, 16), (3, 4, 13, 16), False),  # one query head, four K/V heads
    ((2, 8, 9, 16), (2, 1, 13, 16), (2, 4, 13, 16), True),  # key's one head to value's 4, GQA
    ((2, 4, 9, 16), (2, 1, 13, 16), (1, 1, 13, 16), False),  # MQA, value over the batch too
    ((1, 9, 16), (3, 13, 16), (3, 13, 16), False),  # 3-d, batch broadcast
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_shape, k_shape, v_shape, gqa", BROADCASTS, ids=str)
def test_broadcast_batch_dims(q_shape, k_shape, v_shape, gqa, causal, device):
    """O and the gradients against SDPA in float64 (which broadcasts through its matmuls); a
    broadcast operand reaches the kernels as a stride-0 view of its own memory, never an
    expanded copy, and its gradient has its shape: summed over the dims it was broadcast over,
    as autograd sums SDPA's."""
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(s, generator=g, device=device).half() for s in (q_shape, k_shape, v_shape)
    )
    ref = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=causal, enable_gqa=gqa
    )
    do = torch.randn(ref.shape, generator=g, device=device).half()
    ours = _forward_and_grads(tritonkit.attention, q, k, v, do, None, 0.0, causal, None, gqa)
    exact = _forward_and_grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
        *(t.double() for t in (q, k, v)),
        do.double(),
    )
    for name, a, r, t in zip(["o", "dq", "dk", "dv"], ours, exact, (ref, q, k, v)):
        assert a.shape == t.shape and a.dtype == torch.float16, name
        bound = FWD_BOUND if name == "o" else GRAD_BOUND
        assert _rel(a, r) < bound, f"{name}: relative L2 error {_rel(a, r):.3g}"
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    _, saved = saved_tensors(lambda: tritonkit.attention(*leaves, is_causal=causal, enable_gqa=gqa))
    for t, seen in zip(leaves, saved[:3]):  # AttentionFunction saves q, k, v first
        assert (
            seen.dim() == 4 and seen.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        )
        assert seen.untyped_storage().nbytes() == t.untyped_storage().nbytes()  # not a copy


def test_broadcast_batch_dims_with_a_mask(device):
    """The mask broadcasts to the broadcast batch: a 3-d query with 4-d key/value and a (L, S)
    padding mask, and a batch-1 mask over a broadcast batch."""
    g = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(4, 9, 16, generator=g, device=device).half()
    k, v = (torch.randn(3, 4, 13, 16, generator=g, device=device).half() for _ in range(2))
    for mask in (
        torch.rand(9, 13, generator=g, device=device) > 0.3,
        torch.randn(1, 4, 1, 13, generator=g, device=device),
    ):
        o = tritonkit.attention(q, k, v, mask)
        m64 = mask.double() if mask.is_floating_point() else mask
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), m64)
        assert o.shape == ref.shape == (3, 4, 9, 16)
        assert _rel(o, ref) < FWD_BOUND


def test_float32_inputs(device):
    q, k, v = _qkv(1, 2, 1, 23, 31, 32, device, dtype=torch.float32)
    o, dq, dk, dv = _forward_and_grads(
        tritonkit.attention, q, k, v, torch.ones_like(q), None, 0.0, True
    )
    ref = _forward_and_grads(
        sdpa_reference,
        q.double(),
        k.double(),
        v.double(),
        torch.ones_like(q).double(),
        None,
        0.0,
        True,
    )
    for a, r in zip((o, dq, dk, dv), ref):
        assert a.dtype == torch.float32 and _rel(a, r) < 1e-5


# ---- configs: every block edge ------------------------------------------------------------------

FWD_TILES = [Tile(16, 16), Tile(16, 32), Tile(64, 16), Tile(32, 64)]
BWD_CONFIGS = [
    BwdConfig(Tile(16, 16), Tile(16, 16)),
    BwdConfig(Tile(32, 16), Tile(16, 64)),
    BwdConfig(Tile(16, 64), Tile(64, 16)),
    BwdConfig(Tile(16, 32), Tile(32, 16), atomic_dq=True),
]


def _launch(q, k, v, mask, causal, window, tile, bwd):
    """O and the gradients through the launchers with explicit configs."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    left, right = (-1 if w is None else w for w in (window or (None, None)))
    args = (mask, None, None, q.shape[-2], k.shape[-2], None, 0.0, scale, causal, left, right)
    o, lse = attention_forward(q, k, v, *args, path="flash", config=tile)
    do = torch.randn(o.shape, generator=torch.Generator(q.device).manual_seed(3), device=q.device)
    do = do.to(q.dtype)
    grads = attention_backward(do, q, k, v, o, lse, *args, config=bwd)
    return o, grads, do


@pytest.mark.slow  # every tile: the full tier; the default tiles run in the fast one
@pytest.mark.parametrize("tile, bwd", list(zip(FWD_TILES, BWD_CONFIGS)), ids=str)
@pytest.mark.parametrize(
    "causal, window, masked",
    [(False, None, False), (True, None, True), (False, (13, 5), False), (True, (20, None), True)],
    ids=["full", "causal+mask", "window", "causal-window+mask"],
)
def test_tile_configs(tile, bwd, causal, window, masked, device):
    """Block starts and ends against the band, the sequences' ends and the padded rows."""
    q, k, v = _qkv(1, 2, 1, 53, 61, 32, device)
    mask = torch.rand(1, 2, 53, 61, device=device) > 0.2 if masked else None
    o, grads, do = _launch(q, k, v, mask, causal, window, tile, bwd)
    ref = _forward_and_grads(
        sdpa_reference,
        *(t.double() for t in (q, k, v)),
        do.double(),
        mask,
        0.0,
        causal,
        None,
        True,
        window,
    )
    for name, a, r in zip(["o", "dq", "dk", "dv"], (o, *grads), ref):
        assert _rel(a, r) < (FWD_BOUND if name == "o" else GRAD_BOUND), name


# ---- dropout ---------------------------------------------------------------------------------


def _keep_matrix(seed, b, h, n, dropout_p, device):
    """The dropout keep mask of a (b, h, n, n) call, read back through V = I and uniform P."""
    torch.manual_seed(seed)
    q = torch.zeros(b, h, n, n, device=device).half()
    v = torch.eye(n, device=device).half().expand(b, h, n, n)
    o = tritonkit.attention(q, q, v, dropout_p=dropout_p)
    scaled = o.float() * n * (1 - dropout_p)  # kept: 1, dropped: 0
    keep = scaled > 0.5
    assert torch.allclose(scaled, keep.float(), atol=2e-2)
    return keep


def test_dropout_rate_and_mean(device):
    """The keep rate is 1 - p within 5 binomial standard deviations, and the output's
    expectation is the no-dropout output (inverted scaling)."""
    p, n = 0.3, 64
    keep = _keep_matrix(0, 2, 4, n, p, device)
    total = keep.numel()
    rate = 1 - keep.float().mean().item()
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / total)
    # rows and key positions are not correlated with the draw: every quarter of the keys
    # (the Philox draw serves four keys) keeps the same rate
    for j in range(4):
        part = 1 - keep[..., j::4].float().mean().item()
        assert abs(part - p) < 5 * math.sqrt(p * (1 - p) / (total / 4))
    q, k, v = _qkv(8, 4, 4, 16, 64, 16, device)
    torch.manual_seed(1)
    o = tritonkit.attention(q, k, v, dropout_p=p).float()
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    # mean over the batch of the dropped outputs vs the expectation: (o - ref) averages to 0
    assert abs((o - ref).mean().item()) < 5 * (o - ref).std().item() / math.sqrt(o.numel())


def test_dropout_forward_and_backward_see_the_same_mask(device):
    """With the mask read back, the whole forward and backward equal the float64 formula with
    that mask applied (the backward regenerates it from the same Philox counters)."""
    p, n = 0.25, 32
    keep = _keep_matrix(7, 1, 2, n, p, device)
    q, k, v = _qkv(1, 2, 2, n, n, n, device)
    do = torch.randn(q.shape, device=device).half()
    torch.manual_seed(7)
    ours = _forward_and_grads(tritonkit.attention, q, k, v, do, None, p, True)

    def with_mask(q, k, v):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(n)
        causal = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~causal, float("-inf"))
        return (torch.softmax(s, -1) * keep / (1 - p)) @ v

    ref = _forward_and_grads(with_mask, *(t.double() for t in (q, k, v)), do.double())
    for a, r in zip(ours, ref):
        assert _rel(a, r) < GRAD_BOUND


def test_dropout_is_reproducible_and_seeded(device):
    q, k, v = _qkv(1, 2, 1, 29, 40, 32, device)
    do = torch.randn(q.shape, device=device).half()

    def run(seed):
        torch.manual_seed(seed)
        return _forward_and_grads(tritonkit.attention, q, k, v, do, None, 0.2, False, None, True)

    first, again, other = run(11), run(11), run(12)
    for a, b in zip(first, again):
        assert torch.equal(a, b)  # bit-identical, gradients included
    assert not torch.equal(first[0], other[0])
    rng = draw_rng(q.device)
    assert rng.dtype == torch.int64 and rng.device == q.device  # read by the kernels


def test_dropout_with_varlen_and_gqa(device):
    p = 0.2
    q, k, v = _qkv(1, 4, 2, 16, 16, 32, device)
    torch.manual_seed(3)
    a = tritonkit.attention(q, k, v, dropout_p=p, enable_gqa=True)
    torch.manual_seed(3)
    b = tritonkit.attention(q, k, v, dropout_p=p, enable_gqa=True)
    assert torch.equal(a, b) and (a == 0).any() is not None
    # packed: two sequences, gradients finite and reproducible
    qp, kp, vp = (t[0].transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v))
    cu = torch.tensor([0, 7, 16], dtype=torch.int32, device=device)
    torch.manual_seed(4)
    o = tritonkit.attention_varlen(qp, kp, vp, cu, cu, 9, 9, dropout_p=p, causal=True)
    g1 = torch.autograd.grad(o.float().sum(), (qp, kp, vp))
    torch.manual_seed(4)
    o2 = tritonkit.attention_varlen(qp, kp, vp, cu, cu, 9, 9, dropout_p=p, causal=True)
    g2 = torch.autograd.grad(o2.float().sum(), (qp, kp, vp))
    assert torch.equal(o, o2) and all(torch.equal(x, y) for x, y in zip(g1, g2))


# ---- packed batches ------------------------------------------------------------------------------


def _varlen_reference(q, k, v, cu_q, cu_k, causal, window):
    outs = []
    for i in range(len(cu_q) - 1):
        qs = q[cu_q[i] : cu_q[i + 1]].transpose(0, 1)[None]
        ks, vs = (t[cu_k[i] : cu_k[i + 1]].transpose(0, 1)[None] for t in (k, v))
        diag = ks.shape[2] - qs.shape[2]
        o = sdpa_reference(qs, ks, vs, None, 0.0, causal, None, True, window, diag)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize(
    "lens_q, lens_k, causal, window",
    [
        ([5, 17, 1, 30], [5, 17, 1, 30], True, None),
        ([12, 3, 20], [4, 25, 20], True, None),  # bottom-right: rows of sequence 0 see nothing
        ([9, 26], [31, 14], False, (6, 2)),
        ([16, 16], [40, 3], False, None),
    ],
)
def test_varlen(lens_q, lens_k, causal, window, device):
    cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(sum(lens_q), 4, 32, generator=g, device=device).half()
    k = torch.randn(sum(lens_k), 2, 32, generator=g, device=device).half()
    v = torch.randn(sum(lens_k), 2, 32, generator=g, device=device).half()
    do = torch.randn(q.shape, generator=g, device=device).half()
    args = (cu_q, cu_k, max(lens_q), max(lens_k), 0.0, None, causal, window)
    ours = _forward_and_grads(tritonkit.attention_varlen, q, k, v, do, *args)
    ref = _forward_and_grads(
        _varlen_reference,
        *(t.double() for t in (q, k, v)),
        do.double(),
        cu_q.tolist(),
        cu_k.tolist(),
        causal,
        window,
    )
    for name, a, r in zip(["o", "dq", "dk", "dv"], ours, ref):
        assert _rel(a, r) < (FWD_BOUND if name == "o" else GRAD_BOUND), name


def test_varlen_batches_of_the_same_rows_and_another_count_of_sequences(device):
    """Packed batches of the same rows, split into 2 sequences and then into 3 (the same
    tensors' shapes, another cu_seqlens length): each call gets its own plan (the grid
    counts sequences), and its own answer."""
    g = torch.Generator(device=device).manual_seed(3)
    q, k, v, do = (torch.randn(23, 2, 16, generator=g, device=device).half() for _ in range(4))
    for lens in ([11, 12], [4, 12, 7]):
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
        args = (cu, cu, max(lens), max(lens), 0.0, None, True, None)
        ours = _forward_and_grads(tritonkit.attention_varlen, q, k, v, do, *args)
        up = (t.double() for t in (q, k, v))
        ref = _forward_and_grads(
            _varlen_reference, *up, do.double(), cu.tolist(), cu.tolist(), True, None
        )
        for name, a, r in zip(["o", "dq", "dk", "dv"], ours, ref):
            assert _rel(a, r) < (FWD_BOUND if name == "o" else GRAD_BOUND), (lens, name)


# ---- split-KV decoding ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_q, n_k, h, h_kv, kind, config",
    [
        (1, 200, 8, 2, "full", DecodeGemmConfig(16, splits=5)),
        (3, 77, 4, 4, "padding", DecodeGemmConfig(32, splits=3)),
        (16, 120, 4, 1, "causal", DecodeGemmConfig(16, splits=4)),
        (5, 90, 6, 2, "window", DecodeGemmConfig(16, splits=6)),  # splits outside the window
        (2, 64, 2, 2, "additive", None),
    ],
)
def test_split_kv_decoding(n_q, n_k, h, h_kv, kind, config, device):
    """Few queries against many keys: split over the keys and merged; GQA rows share K/V."""
    q, k, v = _qkv(2, h, h_kv, n_q, n_k, 32, device)
    mask, causal, window = None, kind == "causal", (20, 3) if kind == "window" else None
    if kind == "padding":
        mask = torch.arange(n_k, device=device)[None, None, None, :] < torch.tensor(
            [50, 77], device=device
        ).view(2, 1, 1, 1)
    elif kind == "additive":
        mask = torch.randn(2, 1, n_q, n_k, device=device)
    scale = 1.0 / math.sqrt(32)
    left, right = (-1 if w is None else w for w in (window or (None, None)))
    if mask is not None:  # the launchers take the mask broadcast to (B, H, L, S)
        mask = mask.expand(2, h, n_q, n_k)
    o, lse = attention_forward(
        q, k, v, mask, None, None, n_q, n_k, None, 0.0, scale, causal, left, right, "decode", config
    )
    m64 = mask.double() if mask is not None and mask.is_floating_point() else mask
    ref = sdpa_reference(q.double(), k.double(), v.double(), m64, 0.0, causal, None, True, window)
    assert _rel(o, ref) < FWD_BOUND
    _, lse_flash = attention_forward(
        q, k, v, mask, None, None, n_q, n_k, None, 0.0, scale, causal, left, right, "flash"
    )
    finite = torch.isfinite(lse_flash)
    assert torch.equal(finite, torch.isfinite(lse)) and torch.allclose(
        lse[finite], lse_flash[finite], atol=1e-4
    )


def test_decoding_is_chosen_automatically_and_has_a_backward(device):
    q, k, v = _qkv(2, 4, 2, 4, 90, 32, device)
    _assert_matches_reference(q, k, v, causal=False)
    mask = torch.rand(2, 1, 4, 90, device=device) > 0.5
    _assert_matches_reference(q, k, v, mask=mask)


# ---- workbench variants ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["naive", "flash", "tuned"])
def test_variants(variant, device):
    q, k, v = _qkv(1, 4, 2, 70, 45, 32, device)
    mask = torch.rand(1, 1, 70, 45, device=device) > 0.3
    o = attention_variant(q, k, v, mask, 0.0, True, None, True, (30, None), variant=variant)
    ref = sdpa_reference(
        q.double(), k.double(), v.double(), mask, 0.0, True, None, True, (30, None)
    )
    assert _rel(o, ref) < FWD_BOUND


# ---- validation -------------------------------------------------------------------------------


def test_bad_arguments_raise_before_launching(device):
    q, k, v = _qkv(1, 4, 2, 8, 8, 16, device)
    with pytest.raises(
        ValueError, match=r"key/value heads \(2\) must equal query heads \(4\).*enable_gqa"
    ):
        tritonkit.attention(q, k, v)
    with pytest.raises(TypeError, match="key must have the same dtype as query"):
        tritonkit.attention(q, k.float(), v, enable_gqa=True)
    with pytest.raises(ValueError, match="dropout_p must be a float in"):
        tritonkit.attention(q, k, v, dropout_p=1.0, enable_gqa=True)
    with pytest.raises(ValueError, match="window's left must be"):
        tritonkit.attention(q, k, v, enable_gqa=True, window=(-3, 0))
    with pytest.raises(TypeError, match="window must be None or a"):
        tritonkit.attention(q, k, v, enable_gqa=True, window=5)
    with pytest.raises(ValueError, match=r"attn_mask must be broadcastable to \(1, 4, 8, 8\)"):
        tritonkit.attention(
            q, k, v, torch.ones(3, 8, dtype=torch.bool, device=device), enable_gqa=True
        )
    with pytest.raises(TypeError, match="attn_mask must be bool, float32 or query's dtype"):
        tritonkit.attention(q, k, v, torch.ones(8, 8, device=device).bfloat16(), enable_gqa=True)
    with pytest.raises(
        UnsupportedAttention, match=r"value's head dim must be query's \(16\), got 8"
    ):
        tritonkit.attention(q, k, v[..., :8], enable_gqa=True)
    with pytest.raises(UnsupportedAttention, match=r"query must have dtype .*, got float64"):
        tritonkit.attention(q.double(), k.double(), v.double(), enable_gqa=True)
    with pytest.raises(UnsupportedAttention, match="attn_mask must not require grad"):
        tritonkit.attention(
            q, k, v, torch.zeros(8, 8, device=device, requires_grad=True), enable_gqa=True
        )
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    qp, kp = q[0].transpose(0, 1), k[0].transpose(0, 1)
    with pytest.raises(TypeError, match="cu_seqlens_q must have dtype int32"):
        tritonkit.attention_varlen(qp, kp, kp, cu.long(), cu, 8, 8)
    with pytest.raises(ValueError, match="max_seqlen_k must be an int >= 0"):
        tritonkit.attention_varlen(qp, kp, kp, cu, cu, 8, -1)
    with pytest.raises(ValueError, match="k must be 3-d"):
        tritonkit.attention_varlen(qp, k, k, cu, cu, 8, 8)
    with pytest.raises(TypeError, match=r"query must have dtype .* bfloat16, got int32"):
        tritonkit.attention(q.int(), k, v, enable_gqa=True)
    # Batch dims that do not broadcast; K and V heads that differ (SDPA repeats each to the
    # query's with enable_gqa, the kernels read one count); GQA whose heads do not divide.
    with pytest.raises(ValueError, match=r"batch dims must broadcast, got 1, 2 and 3"):
        tritonkit.attention(q, k.expand(2, 2, 8, 16), v.expand(3, 2, 8, 16), enable_gqa=True)
    with pytest.raises(ValueError, match=r"value must have key's length \(8\), got 5"):
        tritonkit.attention(q, k, v[:, :, :5], enable_gqa=True)
    with pytest.raises(
        UnsupportedAttention, match="key's and value's heads must be equal or one of them 1"
    ):
        tritonkit.attention(q, k, torch.cat([v, v], 1), enable_gqa=True)
    with pytest.raises(
        ValueError, match=r"with enable_gqa=True, key/value heads \(4\) must divide query heads"
    ):
        tritonkit.attention(q[:, :1], torch.cat([k, k], 1), torch.cat([v, v], 1), enable_gqa=True)
    with pytest.raises(UnsupportedAttention, match="key must be 3-d or 4-d, got 2-d"):
        tritonkit.attention(q, k[0, 0], v, enable_gqa=True)
    # What the shapes tell, on every device: packed rows in no sequence.
    with pytest.raises(ValueError, match="cu_seqlens_q must hold one sequence or more"):
        tritonkit.attention_varlen(qp, kp, kp, cu[:1], cu[:1], 8, 8)
    with pytest.raises(ValueError, match="max_seqlen_q must be at least 1 for q's 8 packed rows"):
        tritonkit.attention_varlen(qp, kp, kp, cu, cu, 0, 8)


# cu_seqlens_q, cu_seqlens_k, max_seqlen_q for 12 packed rows of q and k; what the error says
# (on the host for CPU tensors, in the forward kernel's device-side assert on CUDA).
BAD_CU_SEQLENS = [
    ([1, 6, 13], [0, 5, 12], 7, "cu_seqlens_q must start at 0"),
    ([0, 5, 12], [0, 13, 12], 7, "cu_seqlens_k must not decrease"),
    ([0, 5, 11], [0, 5, 12], 7, "cu_seqlens_q must end at"),
    ([0, 5, 12], [0, 5, 9], 7, "cu_seqlens_k must end at"),
    ([0, 5, 12], [0, 5, 12], 6, "max_seqlen_q must be at least the longest sequence"),
]

_CU_CODE = """
import torch, tritonkit
q, k, v = (torch.randn(12, 2, 16, device="cuda", dtype=torch.float16) for _ in range(3))
good = torch.tensor([0, 5, 12], dtype=torch.int32, device="cuda")
tritonkit.attention_varlen(q, k, v, good, good, 7, 7)
torch.cuda.synchronize()
print("good call ran")
cu_q = torch.tensor({cu_q}, dtype=torch.int32, device="cuda")
cu_k = torch.tensor({cu_k}, dtype=torch.int32, device="cuda")
o = tritonkit.attention_varlen(q, k, v, cu_q, cu_k, {max_q}, 7)
torch.cuda.synchronize()
print("NOT STOPPED", o.float().sum().item())
"""


def test_varlen_bad_cu_seqlens_raise(device):
    """cu_seqlens that do not describe the packed rows never read out of bounds nor leave rows
    unwritten: on the CPU a ValueError naming the argument before any launch; on CUDA the
    forward kernel's device-side assert, which kills the CUDA context (so subprocesses run
    them, side by side)."""
    if device.type == "cuda":
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", _CU_CODE.format(cu_q=cu_q, cu_k=cu_k, max_q=max_q)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for cu_q, cu_k, max_q, _ in BAD_CU_SEQLENS
        ]
        for run, (*_, message) in zip(runs, BAD_CU_SEQLENS):
            out = run.communicate(timeout=600)[0]
            assert run.returncode != 0 and "good call ran" in out, out[-3000:]
            assert "device-side assert" in out and "NOT STOPPED" not in out, out[-3000:]
            # The argument named: which of a case's asserts stops the kernel first may vary.
            assert f"attention_varlen: {message.split()[0]} must" in out, out[-3000:]
        return
    q, k, v = (torch.randn(12, 2, 16, device=device) for _ in range(3))
    before = _attn_fwd_kernel.stats["triton"]
    for cu_q, cu_k, max_q, message in BAD_CU_SEQLENS:
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device=device) for c in (cu_q, cu_k))
        with pytest.raises(ValueError, match=message):
            tritonkit.attention_varlen(q, k, v, cu_q, cu_k, max_q, 7)
    assert _attn_fwd_kernel.stats["triton"] == before  # nothing launched


def test_autocast_runs_in_the_lower_precision(device):
    q, k, v = _qkv(1, 2, 2, 12, 12, 16, device, dtype=torch.float32)
    with torch.autocast(device.type, dtype=torch.float16):
        o = tritonkit.attention(q, k, v)
        ref = F.scaled_dot_product_attention(q, k, v)
    assert o.dtype == ref.dtype == torch.float16


# ---- the SDPA patch ----------------------------------------------------------------------------


def test_sdpa_patch_routes_and_counts(device):
    original = F.scaled_dot_product_attention
    q, k, v = _qkv(1, 2, 2, 10, 10, 16, device)
    mha = torch.nn.MultiheadAttention(32, 2, batch_first=True, device=device).half()
    x = torch.randn(2, 9, 32, device=device).half()
    expected = mha(x, x, x, need_weights=False)[0]
    with sdpa_patch() as report:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        got = mha(x, x, x, need_weights=False)[0]  # nn.MultiheadAttention calls F's SDPA
        with pytest.raises(UnsupportedAttention, match=r"query must have dtype .*, got float64"):
            F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert F.scaled_dot_product_attention is original
    assert report.routed == 2 and not report.fallbacks
    assert _rel(o, sdpa_reference(q.double(), k.double(), v.double(), None, 0.0, True)) < FWD_BOUND
    assert _rel(got, expected.double()) < 2e-3
    warns = pytest.warns(UserWarning, match="got float64: running PyTorch's SDPA")
    with warns, sdpa_patch(fallback=True) as report:
        F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        F.scaled_dot_product_attention(q, k, v)
    assert report.routed == 1 and report.fallbacks == {
        "query must have dtype float32, float16 or bfloat16, got float64": 2
    }


@pytest.mark.compile
def test_torch_compile_fullgraph(device):
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 1, 20, 24, 32, device))
    mask = torch.rand(1, 1, 20, 24, device=device) > 0.2

    def f(q, k, v):
        return (
            tritonkit.attention(q, k, v, mask, is_causal=True, enable_gqa=True, window=(8, None))
            * 2
        )

    compiled = torch.compile(f, fullgraph=True, backend=compile_backend(device))
    o = compiled(q, k, v)
    o.float().sum().backward()
    ref = f(q.detach(), k.detach(), v.detach())
    assert torch.equal(o.detach(), ref) and q.grad is not None and torch.isfinite(k.grad).all()


def test_warm_calls_reuse_their_plan_and_verdict(device, monkeypatch):
    """What a call decides is decided once per key: a second call of a key validates nothing
    again and builds no plan (forward or backward), and gives the first call's outputs and
    gradients; a call that differs in what the key holds (the scale, causal, strides) gets a
    plan of its own and the right answer. The cached verdict lets no invalid call through:
    what validation reads beyond the key's shapes (a mask that needs a gradient under grad
    mode, is_causal's type) is part of the key."""
    from tritonkit.ops.attention import function

    calls = {"check": 0, "fwd": 0, "bwd": 0}

    def counted(name, fn):
        def wrapped(*args):
            calls[name] += 1
            return fn(*args)

        return wrapped

    monkeypatch.setattr(function, "_check_attention", counted("check", function._check_attention))
    monkeypatch.setattr(function, "forward_plan", counted("fwd", function.forward_plan))
    monkeypatch.setattr(function, "backward_plan", counted("bwd", function.backward_plan))
    # A shape no other test uses: the first call of its key here is its first anywhere.
    q, k, v = _qkv(1, 3, 3, 19, 21, 24, device)  # 19 queries: the flash path
    do = torch.randn(q.shape, device=device).to(q.dtype)
    first = _forward_and_grads(tritonkit.attention, q, k, v, do, is_causal=True)
    assert calls == {"check": 1, "fwd": 1, "bwd": 1}
    second = _forward_and_grads(tritonkit.attention, q, k, v, do, is_causal=True)
    assert calls == {"check": 1, "fwd": 1, "bwd": 1}
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # Other scalars, other strides: plans of their own, checked against the reference.
    _assert_matches_reference(q, k, v, causal=True, scale=0.3)
    assert calls["fwd"] == 2 and calls["bwd"] == 2
    _assert_matches_reference(q, k, v, causal=False)
    assert calls["fwd"] == 3
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, L, H, D) memory, same values
    _assert_matches_reference(qt, k, v, causal=True)
    assert calls["fwd"] == 4
    # The verdict of a valid call does not carry over to an invalid one of the same shapes.
    mask = torch.zeros(19, 21, device=device)
    tritonkit.attention(q, k, v, mask)
    needs_grad = mask.clone().requires_grad_()
    with pytest.raises(UnsupportedAttention, match="attn_mask must not require grad"):
        tritonkit.attention(q, k, v, needs_grad)
    with torch.no_grad():  # no gradient can flow to it: valid
        tritonkit.attention(q, k, v, needs_grad)
    with pytest.raises(TypeError, match="is_causal must be a bool, got int"):
        tritonkit.attention(q, k, v, is_causal=1)
