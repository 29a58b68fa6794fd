"""Bad input to every public function: a correct result or a clear error, never garbage.

Each function of ``tritonkit.__all__`` and each module of ``tritonkit.nn`` is one row of TABLE:
how to call it with valid arguments, what PyTorch computes, and the row's own probes (bad
parameters, out-of-range indices). The generic probes are derived from the valid arguments:
every accepted dtype; wrong dtypes (int, float64, bool) and mixed float dtypes; meta tensors
and mixed devices (a CPU tensor on a GPU run cannot be made here, so meta stands for "another
device"); mismatched shapes; non-contiguous, transposed and expanded (stride-0) inputs, forward
and backward; empty tensors; NaN and inf; a list where a tensor belongs.

PyTorch is the oracle. Where it rejects an input, tritonkit must raise TypeError, ValueError,
NotImplementedError or IndexError whose message names the argument. Where it accepts one,
tritonkit must give its result, within the operator's spec tolerance of the float64 reference
(NaN and inf where PyTorch has them), or refuse in that same clear way. Probes of inputs the
documentation promises to take (layouts, empty tensors, special values) must give the result;
an accepted dtype gives it too, or NotImplementedError naming the dtype where the device cannot
compute it. A crash (RuntimeError, a Triton error), a hang, or a wrong answer fails.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import tritonkit
from tritonkit.harness.check import compare
from tritonkit.harness.spec import DEFAULT_TOLERANCES, get_spec

from _checks import DEVICE

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
CLEAR = (TypeError, ValueError, NotImplementedError, IndexError)
SEED = int(os.environ.get("TRITONKIT_SEED", int.from_bytes(os.urandom(3), "little")))


@dataclass(frozen=True)
class Probe:
    """One way to call a function: ``change`` turns the row's valid arguments into the probed
    ones. ``names``: the arguments a clear error may name (empty: the call must succeed)."""

    label: str
    change: Callable[[dict[str, Any]], dict[str, Any]] = lambda kw: kw
    names: tuple[str, ...] = ()
    dtype: torch.dtype | None = None  # the dtype of the valid arguments (None: the row's first)
    grad: bool = False  # also compare the gradients of every float tensor argument
    reference: Callable[..., Any] | None = None  # where tritonkit takes more than PyTorch does
    # An accepted dtype a device cannot compute (bf16 dots under the interpreter) may be
    # refused with NotImplementedError naming it, instead of giving the result.
    refuse: str | None = None


@dataclass(frozen=True)
class Row:
    name: str  # as a user calls it: "gelu", "nn.LayerNorm"
    fn: Callable[..., Any]  # called with the arguments as keywords
    reference: Callable[..., Any]  # PyTorch's computation, same keywords
    make: Callable[[torch.dtype], dict[str, Any]]  # valid arguments (random, never zeros)
    spec: str  # the OpSpec whose tolerance applies
    dtypes: tuple[torch.dtype, ...] = FLOATS
    empty: tuple[str, ...] = ()  # arguments whose first dimension an empty call sets to 0
    backward: bool = True
    specials: bool = True  # NaN and inf probed (not for integer or fp8 inputs)
    grads: tuple[str, ...] | None = None  # arguments with a gradient (None: every float tensor)
    probes: tuple[Probe, ...] = ()


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def targets(n: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), device=DEVICE)


def module(cls, *args, inputs: tuple[str, ...] = ("x",), **kwargs) -> Callable[..., Any]:
    """An nn module called on its inputs, its parameters passed as arguments (so that the
    probes reach them too: a weight of another dtype, device or shape)."""

    def call(**kw):
        m = cls(*args, **kwargs)
        params = {k: v for k, v in kw.items() if k not in inputs}
        return torch.func.functional_call(m, params, tuple(kw[k] for k in inputs))

    return call


def with_(**changes) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Probe change: the given arguments replaced (a callable is applied to the arguments)."""
    return lambda kw: {**kw, **{k: v(kw) if callable(v) else v for k, v in changes.items()}}


def set_at(arg: str, index: int, value: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(kw):
        t = kw[arg].clone()
        t[index] = value
        return {**kw, arg: t}

    return change


ACTIVATIONS: dict[str | None, Callable[[torch.Tensor], torch.Tensor]] = {
    None: lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


def _act(name: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}")
    return ACTIVATIONS[name]


def _add_norm(norm):
    def reference(x, residual, weight, eps, bias=None):
        h = x + residual
        args = (weight, bias) if norm is F.layer_norm else (weight,)
        return norm(h, h.shape[-1:], *args, eps=eps), h

    return reference


def _ce_weight_cast(input, weight, **kw):
    return F.cross_entropy(input, weight=weight.to(input.dtype), **kw)


def _int8_reference(a, b, scale_a=None, scale_b=None, out_dtype=torch.int32):
    if scale_a is None and scale_b is None:
        if out_dtype != torch.int32:
            raise ValueError("out_dtype other than int32 needs scales")
        # Exact, as torch._int_mm; int64 products on the CPU (CUDA has no int64 matmul).
        host = a.device if a.device.type != "cuda" else torch.device("cpu")  # host: int64 @
        return (a.to(host).long() @ b.to(host).long()).to(torch.int32).to(a.device)
    if out_dtype not in FLOATS:
        raise ValueError(f"a dequantised output must be a float dtype, got {out_dtype}")
    return ((a.double() @ b.double()) * scale_a.double() * scale_b.double()).to(out_dtype)


def _scaled_reference(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, bias=None):
    if out_dtype not in FLOATS:
        raise ValueError(f"out_dtype must be a float dtype, got {out_dtype}")
    if a.shape[-1] != b.shape[0]:
        raise ValueError("inner dimensions differ")
    out = (a.double() @ b.double()) * scale_a.double() * scale_b.double()
    if bias is not None:
        out = out + bias.double()
    # PyTorch rounds once to out_dtype; the float64 reference (upcast operands) stays float64.
    return out if a.dtype == torch.float64 else out.to(out_dtype)


R, C = 3, 37  # rows and columns: odd, not powers of 2


def _heads(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A rope table ((T, D) or (B, T, D), as transformers' rotary modules give it) over x's
    heads, in x's dtype (tables may be float32 beside 16-bit x)."""
    return (table if table.dim() == 2 else table.unsqueeze(1)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


M, K, N = 5, 32, 7  # GEMM sizes (K a multiple of 16, as fp8 GEMMs take it)
LOGITS = (5, 11)


_CU = torch.tensor([0, 5, 12], dtype=torch.int32, device=DEVICE)


def _heads_expanded(t: torch.Tensor) -> torch.Tensor:
    """A packed (total, heads, D) tensor with head 0 repeated through stride 0."""
    return t[:, :1].expand(t.shape)


def _varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      causal=False):  # fmt: skip
    """Packed sequences one at a time through SDPA (heads first); causal is flash-attn's,
    aligned bottom-right."""
    if q.is_meta:  # no values to slice by; flash-attn's fake implementation gives this shape
        return torch.empty_like(q)
    outs = []
    bounds = zip(cu_seqlens_q.tolist(), cu_seqlens_q.tolist()[1:], cu_seqlens_k.tolist(),
                 cu_seqlens_k.tolist()[1:])  # fmt: skip
    for q0, q1, k0, k1 in bounds:
        mask = None
        if causal:
            ones = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=q.device)
            mask = ones.tril((k1 - k0) - (q1 - q0))
        o = F.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1), mask
        )
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


TABLE = [
    Row("relu", tritonkit.relu, lambda x: torch.relu(x),
        lambda d: {"x": randn(R, C, dtype=d)}, "relu", empty=("x",),
        probes=(Probe("0-d", with_(x=lambda kw: kw["x"][0, 0])),)),
    Row("gelu", tritonkit.gelu, lambda x, approximate: F.gelu(x, approximate=approximate),
        lambda d: {"x": randn(R, C, dtype=d), "approximate": "none"}, "gelu", empty=("x",), probes=(
            Probe("approximate-tanh", with_(approximate="tanh")),
            Probe("approximate-bad", with_(approximate="exact"), names=("approximate",)),
        )),
    Row("silu", tritonkit.silu, lambda x: F.silu(x), lambda d: {"x": randn(R, C, dtype=d)}, "silu",
        empty=("x",)),
    Row("add", tritonkit.add, lambda x, y: x + y,
        lambda d: {"x": randn(R, C, dtype=d), "y": randn(R, C, dtype=d)}, "add", empty=("x", "y"),
        probes=(Probe("y-broadcast", with_(y=lambda kw: kw["y"][0])),)),
    Row("bias_act", tritonkit.bias_act, lambda x, bias, activation: _act(activation)(x + bias),
        lambda d: {"x": randn(R, C, dtype=d), "bias": randn(C, dtype=d), "activation": "gelu"},
        "bias_act", empty=("x",), probes=(
            Probe("activation-none", with_(activation=None)),
            Probe("activation-bad", with_(activation="tanh"), names=("activation",)),
        )),
    Row("swiglu", tritonkit.swiglu, lambda gate, up: F.silu(gate) * up,
        lambda d: {"gate": randn(R, C, dtype=d), "up": randn(R, C, dtype=d)}, "swiglu",
        empty=("gate", "up")),
    Row("geglu", tritonkit.geglu,
        lambda gate, up, approximate: F.gelu(gate, approximate=approximate) * up,
        lambda d: {"gate": randn(R, C, dtype=d), "up": randn(R, C, dtype=d), "approximate": "none"},
        "geglu", empty=("gate", "up"),
        probes=(Probe("approximate-bad", with_(approximate="fast"), names=("approximate",)),)),
    Row("rope", tritonkit.rope,  # the tables may be float32 beside 16-bit x: x's dtype out
        lambda x, cos, sin: x * _heads(cos, x) + _rotate_half(x) * _heads(sin, x),
        lambda d: {"x": randn(2, 3, 5, 8, dtype=d), "cos": randn(5, 8, dtype=d),
                   "sin": randn(5, 8, dtype=d)},
        "rope", empty=("x",), grads=("x",),
        probes=(Probe("cos-short", with_(cos=lambda kw: kw["cos"][:4]), names=("cos",)),)),
    Row("copy", tritonkit.copy, lambda x: x.clone(), lambda d: {"x": randn(R, C, dtype=d)}, "copy",
        empty=("x",)),
    Row("transpose", tritonkit.transpose, lambda x: x.transpose(-2, -1).contiguous(),
        lambda d: {"x": randn(R, C, dtype=d)}, "transpose", empty=("x",),
        probes=(Probe("1-d", with_(x=lambda kw: kw["x"][0]), names=("x",)),)),
    Row("softmax", tritonkit.softmax, lambda x, dim: torch.softmax(x, dim),
        lambda d: {"x": randn(R, C, dtype=d), "dim": -1}, "softmax", empty=("x",), probes=(
            Probe("dim-0", with_(dim=0)),
            Probe("dim-too-large", with_(dim=2), names=("dim",)),
            Probe("dim-too-small", with_(dim=-3), names=("dim",)),
        )),
    Row("log_softmax", tritonkit.log_softmax, lambda x, dim: torch.log_softmax(x, dim),
        lambda d: {"x": randn(R, C, dtype=d), "dim": -1}, "log_softmax", empty=("x",), probes=(
            Probe("dim-0", with_(dim=0)),
            Probe("dim-too-large", with_(dim=2), names=("dim",)),
        )),
    Row("layer_norm", tritonkit.layer_norm,
        lambda x, normalized_shape, weight, bias, eps: F.layer_norm(x, normalized_shape, weight,
                                                                    bias, eps),
        lambda d: {"x": randn(R, C, dtype=d), "normalized_shape": (C,), "weight": randn(C, dtype=d),
                   "bias": randn(C, dtype=d), "eps": 1e-5}, "layer_norm", empty=("x",), probes=(
            Probe("normalized_shape-mismatch", with_(normalized_shape=(C - 1,)),
                  names=("normalized_shape", "x", "weight")),
            Probe("no-affine", with_(weight=None, bias=None)),
        )),
    Row("rms_norm", tritonkit.rms_norm,
        lambda x, normalized_shape, weight, eps: F.rms_norm(x, normalized_shape, weight, eps),
        lambda d: {"x": randn(R, C, dtype=d), "normalized_shape": (C,), "weight": randn(C, dtype=d),
                   "eps": None}, "rms_norm", empty=("x",), probes=(
            Probe("normalized_shape-mismatch", with_(normalized_shape=(C + 1,)),
                  names=("normalized_shape", "x", "weight")),
            Probe("eps", with_(eps=1e-3)),
        )),
    Row("add_layer_norm", tritonkit.add_layer_norm, _add_norm(F.layer_norm),
        lambda d: {"x": randn(R, C, dtype=d), "residual": randn(R, C, dtype=d),
                   "weight": randn(C, dtype=d), "bias": randn(C, dtype=d), "eps": 1e-5},
        "add_layer_norm", empty=("x", "residual")),
    Row("add_rms_norm", tritonkit.add_rms_norm, _add_norm(F.rms_norm),
        lambda d: {"x": randn(R, C, dtype=d), "residual": randn(R, C, dtype=d),
                   "weight": randn(C, dtype=d), "eps": None},
        "add_rms_norm", empty=("x", "residual")),
    Row("cross_entropy", tritonkit.cross_entropy, F.cross_entropy,
        lambda d: {"input": randn(*LOGITS, dtype=d), "target": targets(*LOGITS),
                   "weight": (randn(LOGITS[1]).abs() + 0.1).to(d), "ignore_index": -100,
                   "reduction": "mean", "label_smoothing": 0.0},
        "cross_entropy", empty=("input", "target"), grads=("input",), probes=(
            Probe("target-ignored", set_at("target", 1, -100)),
            Probe("all-ignored", with_(target=lambda kw: torch.full_like(kw["target"], -100))),
            Probe("ignore_index-3", with_(ignore_index=3, target=lambda kw: kw["target"] % 4)),
            Probe("target-too-large", set_at("target", 2, LOGITS[1]), names=("target",)),
            Probe("target-negative", set_at("target", 2, -2), names=("target",)),
            Probe("reduction-none", with_(reduction="none")),
            Probe("reduction-bad", with_(reduction="avg"), names=("reduction",)),
            Probe("label_smoothing", with_(label_smoothing=0.1)),
            Probe("label_smoothing-bad", with_(label_smoothing=1.5), names=("label_smoothing",)),
            Probe("1-d", with_(input=lambda kw: kw["input"][0], target=lambda kw: kw["target"][0])),
            # float32 class weights beside 16-bit logits (README, "Mixed precision"), which
            # PyTorch's CPU kernel refuses: the reference casts them.
            Probe("weight-float32-among-float16", with_(weight=lambda kw: kw["weight"].float()),
                  ("weight",), dtype=torch.float16,
                  reference=_ce_weight_cast),
        )),
    Row("attention", tritonkit.attention,
        lambda query, key, value, is_causal: F.scaled_dot_product_attention(
            query, key, value, is_causal=is_causal),
        lambda d: {"query": randn(2, 3, 9, 16, dtype=d), "key": randn(2, 3, 11, 16, dtype=d),
                   "value": randn(2, 3, 11, 16, dtype=d), "is_causal": False},
        "attention", empty=("query", "key", "value"), probes=(
            Probe("causal", with_(is_causal=True)),
            Probe("value-head-dim", with_(value=lambda kw: kw["value"][..., :8]),
                  names=("value",)),
        )),
    Row("attention_varlen", tritonkit.attention_varlen, _varlen_reference,
        lambda d: {"q": randn(12, 2, 16, dtype=d), "k": randn(12, 2, 16, dtype=d),
                   "v": randn(12, 2, 16, dtype=d), "cu_seqlens_q": _CU, "cu_seqlens_k": _CU,
                   "max_seqlen_q": 7, "max_seqlen_k": 7},
        "attention_varlen", probes=(
            Probe("cu_seqlens-past-the-end", with_(cu_seqlens_q=lambda kw: kw["cu_seqlens_q"] + 1),
                  names=("cu_seqlens_q",)),
            Probe("cu_seqlens_k-decreasing", set_at("cu_seqlens_k", 1, 13),
                  names=("cu_seqlens_k",)),
            Probe("max_seqlen_q-too-small", with_(max_seqlen_q=6), names=("max_seqlen_q",)),
            Probe("max_seqlen-larger", with_(max_seqlen_q=40, max_seqlen_k=9)),
            Probe("causal", with_(causal=True)),
            # Expanding an index tensor changes its values ([0, 5, 12] -> [0, 0, 0]): no longer
            # the packed layout of q's (k's) 12 rows, which then belong to no sequence.
            Probe("cu_seqlens_q-expanded", with_(cu_seqlens_q=lambda kw: _CU[:1].expand(3)),
                  names=("cu_seqlens_q",)),
            Probe("cu_seqlens_k-expanded", with_(cu_seqlens_k=lambda kw: _CU[:1].expand(3)),
                  names=("cu_seqlens_k",)),
            # Stride 0 over the heads (independent problems, as the batch of attention's row):
            # over the packed rows every key (value) would be the same one, and the exact
            # gradients 0 (dQ; dK too for v) or PyTorch's uniform softmax exact, so that the
            # spec's ratio to PyTorch's error would compare rounding noise.
            *(Probe(f"{n}-expanded{g}", with_(**{n: lambda kw, n=n: _heads_expanded(kw[n])}),
                    grad=bool(g)) for n in ("q", "k", "v") for g in ("", "-grad")),
        )),
    Row("matmul", tritonkit.matmul, lambda a, b: torch.matmul(a, b),
        lambda d: {"a": randn(M, K, dtype=d), "b": randn(K, N, dtype=d)}, "matmul",
        empty=("a",), probes=(
            Probe("batched", with_(a=lambda kw: randn(2, M, K, dtype=kw["a"].dtype))),
            Probe("1-d", with_(a=lambda kw: kw["a"][0])),
            Probe("K-0", with_(a=lambda kw: kw["a"][:, :0], b=lambda kw: kw["b"][:0])),
        )),
    Row("linear", tritonkit.linear,
        lambda x, weight, bias, activation, residual: _act(activation)(F.linear(x, weight, bias))
        + (0 if residual is None else residual),
        lambda d: {"x": randn(M, K, dtype=d), "weight": randn(N, K, dtype=d),
                   "bias": randn(N, dtype=d), "activation": None, "residual": None},
        "linear", empty=("x",), probes=(
            Probe("activation-silu", with_(activation="silu")),
            Probe("activation-bad", with_(activation="swish"), names=("activation",)),
            Probe("residual", with_(residual=lambda kw: randn(M, N, dtype=kw["x"].dtype))),
            Probe("residual-mismatch",
                  with_(residual=lambda kw: randn(M, N + 1, dtype=kw["x"].dtype)),
                  names=("residual",)),
        )),
    Row("int8_matmul", tritonkit.int8_matmul, _int8_reference,
        lambda d: {"a": torch.randint(-8, 8, (M, K), dtype=d, device=DEVICE),
                   "b": torch.randint(-8, 8, (K, N), dtype=d, device=DEVICE)},
        "int8_matmul", dtypes=(torch.int8,), empty=("a",), backward=False, specials=False, probes=(
            Probe("dequant", with_(scale_a=lambda kw: randn(M, 1).abs(),
                                   scale_b=lambda kw: randn(1, N).abs(), out_dtype=torch.bfloat16)),
            Probe("out_dtype-bad", with_(out_dtype=torch.int8), names=("out_dtype",)),
        )),
    Row("scaled_matmul", tritonkit.scaled_matmul, _scaled_reference,
        lambda d: {"a": randn(M, K).to(d), "b": randn(K, N).to(d),
                   "scale_a": randn(1)[0].abs() + 0.5, "scale_b": randn(1)[0].abs() + 0.5,
                   "out_dtype": torch.bfloat16, "bias": None},
        "scaled_matmul", dtypes=FP8, empty=("a",), backward=False, specials=False, probes=(
            Probe("row-scales", with_(scale_a=lambda kw: randn(M, 1).abs(),
                                      scale_b=lambda kw: randn(1, N).abs())),
            Probe("bias", with_(bias=lambda kw: randn(N, dtype=torch.bfloat16))),
            Probe("out_dtype-fp32", with_(out_dtype=torch.float32)),
            Probe("out_dtype-bad", with_(out_dtype=torch.int8), names=("out_dtype",)),
        )),
    # torch.nn modules: the input, then the parameters.
    Row("nn.ReLU", module(tritonkit.nn.ReLU), module(torch.nn.ReLU),
        lambda d: {"x": randn(R, C, dtype=d)}, "relu", empty=("x",)),
    Row("nn.GELU", module(tritonkit.nn.GELU, "tanh"), module(torch.nn.GELU, "tanh"),
        lambda d: {"x": randn(R, C, dtype=d)}, "gelu_tanh", empty=("x",)),
    Row("nn.SiLU", module(tritonkit.nn.SiLU), module(torch.nn.SiLU),
        lambda d: {"x": randn(R, C, dtype=d)}, "silu", empty=("x",)),
    Row("nn.Softmax", module(tritonkit.nn.Softmax, dim=1), module(torch.nn.Softmax, dim=1),
        lambda d: {"x": randn(R, C, dtype=d)}, "softmax", empty=("x",)),
    Row("nn.LogSoftmax", module(tritonkit.nn.LogSoftmax, dim=0), module(torch.nn.LogSoftmax, dim=0),
        lambda d: {"x": randn(R, C, dtype=d)}, "log_softmax", empty=("x",)),
    Row("nn.LayerNorm", module(tritonkit.nn.LayerNorm, C), module(torch.nn.LayerNorm, C),
        lambda d: {"x": randn(R, C, dtype=d), "weight": randn(C, dtype=d),
                   "bias": randn(C, dtype=d)}, "layer_norm", empty=("x",)),
    Row("nn.RMSNorm", module(tritonkit.nn.RMSNorm, C), module(torch.nn.RMSNorm, C),
        lambda d: {"x": randn(R, C, dtype=d), "weight": randn(C, dtype=d)}, "rms_norm",
        empty=("x",)),
    Row("nn.Linear", module(tritonkit.nn.Linear, K, N), module(torch.nn.Linear, K, N),
        lambda d: {"x": randn(M, K, dtype=d), "weight": randn(N, K, dtype=d),
                   "bias": randn(N, dtype=d)}, "linear", empty=("x",)),
    Row("nn.CrossEntropyLoss", module(tritonkit.nn.CrossEntropyLoss, inputs=("input", "target")),
        module(torch.nn.CrossEntropyLoss, inputs=("input", "target")),
        lambda d: {"input": randn(*LOGITS, dtype=d), "target": targets(*LOGITS)},
        "cross_entropy", empty=("input", "target"), probes=(
            Probe("target-too-large", set_at("target", 0, LOGITS[1]), names=("target",)),
        )),
    Row("conv2d", lambda x, weight, bias: tritonkit.conv2d(x, weight, bias, padding=1),
        lambda x, weight, bias: F.conv2d(x, weight, bias, padding=1),
        lambda d: {"x": randn(2, 4, 6, 5, dtype=d), "weight": randn(3, 4, 3, 3, dtype=d),
                   "bias": randn(3, dtype=d)}, "conv2d", empty=("x",)),
    Row("nn.Conv2d", module(tritonkit.nn.Conv2d, 4, 3, 3, padding=1),
        module(torch.nn.Conv2d, 4, 3, 3, padding=1),
        lambda d: {"x": randn(2, 4, 6, 5, dtype=d), "weight": randn(3, 4, 3, 3, dtype=d),
                   "bias": randn(3, dtype=d)}, "conv2d", empty=("x",)),
    # `tritonkit new NAME` adds its operator's row above this line.
]  # fmt: skip

# Known wrong answers, strict: a fix flips them (none at present; add a row with its reason).
KNOWN: dict[tuple[str, str], str] = {}
# On a GPU an out-of-range target, or cu_seqlens that do not describe the packed rows, stop
# the kernel as PyTorch's own device-side assert does, which leaves the process's CUDA context
# unusable: those probes run in a subprocess there (experiments/gpu_rows.py;
# tests/test_attention.py, test_varlen_bad_cu_seqlens_assert_on_cuda), not here.
_CUDA_ONLY_IN_A_SUBPROCESS = {
    ("cross_entropy", "target-too-large"),
    ("cross_entropy", "target-negative"),
    ("nn.CrossEntropyLoss", "target-too-large"),
    ("attention_varlen", "cu_seqlens-past-the-end"),
    ("attention_varlen", "cu_seqlens_k-decreasing"),
    ("attention_varlen", "max_seqlen_q-too-small"),
    ("attention_varlen", "cu_seqlens_q-expanded"),
    ("attention_varlen", "cu_seqlens_k-expanded"),
    ("attention_varlen", "q-shape-first+1"),  # 13 rows of q, cu_seqlens_q ending at 12
}


def _marks(key: tuple[str, str]) -> list:
    if DEVICE.type == "cuda":
        if key in _CUDA_ONLY_IN_A_SUBPROCESS:
            return [pytest.mark.skip(reason="a device-side assert; checked in a subprocess")]
        return []  # a GPU computes bf16 dots right
    return [pytest.mark.xfail(strict=True, reason=KNOWN[key])] if key in KNOWN else []


# ---- the generic probes ------------------------------------------------------------------------


def _tensors(kw: dict[str, Any]) -> list[str]:
    return [k for k, v in kw.items() if isinstance(v, torch.Tensor)]


def _like(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """New values of t's kind at another shape (indices stay in t's range)."""
    if t.dtype.is_floating_point:
        return randn(*shape).to(t.dtype)
    if t.dtype == torch.int8:
        return torch.randint(-8, 8, shape, dtype=t.dtype, device=t.device)
    return torch.randint(0, max(int(t.max()) + 1, 1), shape, dtype=t.dtype, device=t.device)


def _specials(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    flat[0], flat[flat.numel() // 2], flat[-1] = float("nan"), float("inf"), float("-inf")
    return t


_HOST_SPECIALS = ("rms_norm", "add_rms_norm")


def _on_host(reference: Callable[..., Any]) -> Callable[..., Any]:
    """``reference`` computed by PyTorch's CPU kernels, its tensors moved back to the device."""

    def call(**kw):
        device = next(v.device for v in kw.values() if isinstance(v, torch.Tensor))
        host = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        out = reference(**host)
        if isinstance(out, torch.Tensor):
            return out.to(device)
        return type(out)(t.to(device) if isinstance(t, torch.Tensor) else t for t in out)

    return call


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def generic_probes(row: Row) -> list[Probe]:
    base = row.make(row.dtypes[0])
    tensors = _tensors(base)
    first = tensors[0]
    floats = [k for k in tensors if base[k].dtype.is_floating_point]
    probes = [Probe(f"dtype-{_name(d)}", dtype=d, refuse=_name(d)) for d in row.dtypes]
    for k in tensors:  # wrong dtypes
        kind = base[k].dtype
        wrong = (torch.int32, torch.float64, torch.bool)
        if not kind.is_floating_point or kind in FP8:
            wrong = tuple(d for d in (torch.float32, torch.int32, torch.bool) if d != kind)
        probes += [Probe(f"{k}-{_name(d)}", with_(**{k: base[k].to(d)}), (k,)) for d in wrong]
    if torch.float16 in row.dtypes:  # one float32 operand among float16 ones
        probes += [
            Probe(f"{k}-float32-among-float16", with_(**{k: lambda kw, k=k: kw[k].float()}), (k,),
                  dtype=torch.float16)
            for k in floats[1:]
        ]  # fmt: skip
    to_meta = {k: (lambda kw, k=k: kw[k].to("meta")) for k in tensors}
    probes.append(Probe("meta", with_(**to_meta), (first,)))
    probes += [Probe(f"{k}-on-meta", with_(**{k: to_meta[k]}), (k,)) for k in tensors[1:]]
    for k in tensors:  # mismatched shapes: any tensor argument may be the one named
        shape = tuple(base[k].shape)
        changed = []
        if shape:
            changed.append(("last+1", (*shape[:-1], shape[-1] + 1)))
        if len(shape) >= 2:
            changed.append(("first+1", (shape[0] + 1, *shape[1:])))
        changed.append(("extra-dim", (2, *shape)))
        probes += [
            Probe(f"{k}-shape-{what}", with_(**{k: lambda kw, k=k, s=s: _like(kw[k], s)}),
                  tuple(tensors))
            for what, s in changed
        ]  # fmt: skip
    for k in tensors:  # layouts PyTorch takes: the result must come back
        t = base[k]
        if t.dim() >= 1:
            probes.append(Probe(f"{k}-stride2", with_(**{k: lambda kw, k=k: _stride2(kw[k])})))
        if t.dim() >= 2:
            probes.append(
                Probe(f"{k}-transposed", with_(**{k: lambda kw, k=k: _transposed(kw[k])}))
            )
        if t.dim() >= 1 and t.shape[0] > 1:
            expand = with_(**{k: lambda kw, k=k: kw[k][:1].expand(kw[k].shape)})
            probes.append(Probe(f"{k}-expanded", expand))
            if row.backward and k in floats:
                probes.append(Probe(f"{k}-expanded-grad", expand, grad=True))
    if row.backward:
        probes.append(Probe("grad", grad=True))
    if row.empty:
        probes.append(Probe("empty", with_(**{k: lambda kw, k=k: kw[k][:0] for k in row.empty})))
        if row.backward:
            probes.append(
                Probe("empty-grad", with_(**{k: lambda kw, k=k: kw[k][:0] for k in row.empty}),
                      grad=True)
            )  # fmt: skip
    if row.specials:
        # PyTorch's own CUDA RMSNorm is not one oracle for rows holding +-inf: where a row's
        # width is not a multiple of its vector width (37 here) it takes Welford's mean and
        # variance of x (rstd = rsqrt(var + mean^2 + eps)), and inf - inf in the running mean
        # makes the whole row NaN; its vectorized path and its CPU kernel sum the squares
        # (rsqrt(inf) = 0: 0 for the finite elements, NaN for the infinite one), which is the
        # limit of x / rms(x), and what tritonkit computes on every path. The reference of this
        # probe is PyTorch's CPU kernel for the RMSNorm family.
        reference = _on_host(row.reference) if row.spec in _HOST_SPECIALS else None
        probes.append(
            Probe(
                "nan-inf",
                with_(**{floats[0]: lambda kw: _specials(kw[floats[0]])}),
                reference=reference,
            )
        )
    probes.append(Probe(f"{first}-list", with_(**{first: lambda kw: kw[first].tolist()}), (first,)))
    own = {p.label for p in row.probes}  # a row's own probe replaces a generic one
    return [p for p in probes if p.label not in own] + list(row.probes)


def _stride2(t: torch.Tensor) -> torch.Tensor:
    wide = torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    wide.view(torch.uint8).fill_(0xFF)  # the gaps hold NaN (or -1): never to be read
    view = wide[..., ::2]
    view.copy_(t)
    return view


def _transposed(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


# ---- running one probe -------------------------------------------------------------------------


def _upcast(kw: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v.detach().double() if isinstance(v, torch.Tensor) and v.dtype.is_floating_point else v
        for k, v in kw.items()
    }


def _flatten(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _tolerance(row: Row, dtype: torch.dtype, grad: bool):
    spec = get_spec(row.spec)
    if dtype in spec.dtypes:
        return spec.tolerance_for(dtype, grad=grad)
    return DEFAULT_TOLERANCES[torch.float32]


def _with_grads(fn, kw: dict[str, Any], wrt: list[str]) -> tuple[list, list]:
    """(outputs, gradients of the ``wrt`` arguments for fixed random output gradients)."""
    # detach() keeps the layout (clone() would make an expanded input contiguous again).
    leaves = {k: v.detach().requires_grad_() if k in wrt else v for k, v in kw.items()}
    outs = _flatten(fn(**leaves))
    gen = torch.Generator(device=outs[0].device).manual_seed(SEED)
    grads = [torch.randn(o.shape, generator=gen, device=o.device).to(o.dtype) for o in outs]
    return outs, list(torch.autograd.grad(outs, [leaves[k] for k in wrt], grads))


def _names(message: str, names: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", message) for n in names)


def run_probe(row: Row, probe: Probe) -> None:
    torch.manual_seed(SEED)
    dtype = probe.dtype or row.dtypes[0]
    kw = probe.change(row.make(dtype))
    where = f"{row.name} [{probe.label}] (TRITONKIT_SEED={SEED})"
    reference = probe.reference or row.reference
    wrt = [
        k
        for k, v in kw.items()
        if isinstance(v, torch.Tensor)
        and v.dtype.is_floating_point
        and (row.grads is None or k in row.grads)
    ]
    try:
        expected = _with_grads(reference, kw, wrt) if probe.grad else reference(**kw)
        torch_error = None
    except Exception as exc:  # PyTorch rejects this input
        expected, torch_error = None, exc
    try:
        ours = _with_grads(row.fn, kw, wrt) if probe.grad else row.fn(**kw)
    except CLEAR as exc:
        if probe.refuse and isinstance(exc, NotImplementedError) and probe.refuse in str(exc):
            return
        if not probe.names:
            pytest.fail(f"{where}: PyTorch computes this, tritonkit raised {exc!r}")
        assert _names(str(exc), probe.names), (
            f"{where}: {type(exc).__name__} does not name {' or '.join(probe.names)}: {exc}"
        )
        return
    except Exception as exc:
        pytest.fail(f"{where}: crashed with {type(exc).__name__}: {exc}")
    if torch_error is not None:
        pytest.fail(f"{where}: returned a result where PyTorch raises {torch_error!r}")
    if probe.grad:
        (ours_out, ours_grads), (same_out, same_grads) = ours, expected
        ref_out, ref_grads = _with_grads(reference, _upcast(kw), wrt)
        pairs = [(ours_out, ref_out, same_out, False), (ours_grads, ref_grads, same_grads, True)]
    else:
        pairs = [(_flatten(ours), None, _flatten(expected), False)]
    for got, ref, same, grad in pairs:
        if any(t is not None and t.is_meta for t in [*got, *same]):
            shapes = [(tuple(t.shape), t.dtype) for t in got]
            assert shapes == [(tuple(t.shape), t.dtype) for t in same], f"{where}: {shapes}"
            continue
        if ref is None:
            ref = _flatten(reference(**_upcast(kw)))
        outcome = compare(got, ref, same, _tolerance(row, dtype, grad))
        what = "gradients" if grad else "output"
        assert outcome.passed, (
            f"{where}: {what} differs from the float64 reference: {outcome.detail}"
        )


def _cases():
    for row in TABLE:
        for probe in generic_probes(row):
            marks = _marks((row.name, probe.label))
            yield pytest.param(row, probe, id=f"{row.name}-{probe.label}", marks=marks)


@pytest.mark.parametrize("row, probe", list(_cases()))
def test_bad_input(row: Row, probe: Probe):
    run_probe(row, probe)


def test_every_public_function_and_module_has_a_row():
    names = {row.name for row in TABLE}
    functions = [n for n in tritonkit.__all__ if n not in tritonkit._SUBMODULES]
    modules = [  # the modules; nn's helpers (sdpa_patch and its report) are not computed on
        f"nn.{n}"
        for n in tritonkit.nn.__all__
        if isinstance(getattr(tritonkit.nn, n), type)
        and issubclass(getattr(tritonkit.nn, n), torch.nn.Module)
    ]
    missing = [n for n in (*functions, *modules) if n not in names]
    assert not missing, f"add a row to TABLE for: {', '.join(missing)}"


def test_known_failures_name_real_probes():
    labels = {(row.name, p.label) for row in TABLE for p in generic_probes(row)}
    assert set(KNOWN) <= labels, set(KNOWN) - labels
