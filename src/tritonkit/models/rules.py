"""The per-architecture rules of ``tritonkit.patch``: which module gets which forward.

Rules match classes by name (Hugging Face's classes are only recognised, never imported
here, so transformers stays optional) and by structure (the attributes a forward reads).
A module that matches no rule is left as it is and reported with the reason.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import tritonkit
from tritonkit.models.loss import linear_cross_entropy
from tritonkit.models.patcher import Patcher, model_device, original_forward, with_globals

# Families whose decoder layer is ``x + attn(norm(x))`` then ``h + mlp(norm(h))`` with
# RMSNorms ``weight * normalize(x)`` and gated MLPs ``down(act(gate(x)) * up(x))``.
_LLAMA_LIKE = ("Llama", "Mistral", "Qwen2", "Qwen3")
RMS_NORMS = {f"{f}RMSNorm" for f in _LLAMA_LIKE}
DECODER_LAYERS = {f"{f}DecoderLayer" for f in _LLAMA_LIKE}
GATED_MLPS = {f"{f}MLP" for f in _LLAMA_LIKE}
CAUSAL_LMS = {f"{f}ForCausalLM" for f in _LLAMA_LIKE} | {"GPT2LMHeadModel"}
PRE_NORM_BLOCKS = {"GPT2Block"}

# Activation modules -> the tritonkit activation (as a GELU approximation name where GELU).
_TANH_GELUS = {"NewGELUActivation", "GELUTanh", "PytorchGELUTanh", "FastGELUActivation"}
_LEFT_REASONS = {
    "Linear": "GEMM left on PyTorch",
    "Conv1D": "GEMM left on PyTorch",
    "Embedding": "no tritonkit kernel (a gather)",
    "Dropout": "no tritonkit dropout + residual + norm kernel; PyTorch's dropout",
}


def _gemm_library(device: torch.device | None) -> str:
    """What runs PyTorch's GEMMs on ``device``, for the report."""
    if device is None:
        return ""
    if device.type == "cuda":
        return " (rocBLAS/hipBLASLt)" if torch.version.hip else " (cuBLAS)"
    if device.type == "cpu":
        return " (its CPU GEMM)"
    return f" (its {device.type} GEMM)"


def _sdpa_words(device: torch.device | None) -> str:
    """Which kernel PyTorch's SDPA runs on ``device`` under the ``sdpa`` routes."""
    if device is not None and device.type == "cuda" and not torch.version.hip:
        return "SDPA, cuDNN then flash"
    if device is not None and device.type == "cuda":
        return "SDPA, backends in tritonkit's order"
    where = "the CPU" if device is None or device.type == "cpu" else device.type
    return f"SDPA, PyTorch's kernel for {where}"


def _tritonkit_kind(module: nn.Module) -> str | None:
    """``"tritonkit.nn.Linear"`` for a module whose class is tritonkit's own; None otherwise."""
    cls = type(module)
    if not cls.__module__.startswith("tritonkit."):
        return None
    import tritonkit.nn as tk_nn

    if getattr(tk_nn, cls.__name__, None) is cls:
        return f"tritonkit.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _activation_of(module: nn.Module) -> str | None:
    """``"silu"``, ``"gelu"`` (exact) or ``"gelu_tanh"`` for an activation module tritonkit
    computes exactly as it does; None otherwise."""
    name = type(module).__name__
    if isinstance(module, nn.SiLU) or name == "SiLUActivation":
        return None if getattr(module, "inplace", False) else "silu"
    if isinstance(module, nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    if name in _TANH_GELUS:
        # GELUTanh's python variant computes the same formula.
        return "gelu_tanh"
    if name == "GELUActivation":
        return "gelu"
    if isinstance(module, nn.ReLU) and not module.inplace:
        return "relu"
    return None


def _activate(x: torch.Tensor, act: str) -> torch.Tensor:
    if act == "silu":
        return tritonkit.silu(x)
    if act == "relu":
        return tritonkit.relu(x)
    return tritonkit.gelu(x, "tanh" if act == "gelu_tanh" else "none")


def _promote(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """PyTorch's result dtype of ``weight * normalized(x)`` (a float32 weight on 16-bit x
    gives float32); tritonkit's norms return x's dtype."""
    if weight is not None and weight.dtype != x.dtype:
        return out.to(torch.promote_types(weight.dtype, x.dtype))
    return out


def _rms_weight_ok(x: torch.Tensor, w: torch.Tensor | None) -> bool:
    return w is None or w.dtype in (x.dtype, torch.float32)


# -- forwards set on module instances ----------------------------------------------------------


def hf_rms_norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    if not _rms_weight_ok(x, self.weight):
        return original_forward(self)(x)
    out = tritonkit.rms_norm(x, self.weight.shape, self.weight, self.variance_epsilon)
    return _promote(out, x, self.weight)


def rms_norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    if not _rms_weight_ok(x, self.weight):
        return original_forward(self)(x)
    return _promote(
        tritonkit.rms_norm(x, self.normalized_shape, self.weight, self.eps), x, self.weight
    )


def layer_norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    w, b = self.weight, self.bias
    if w is not None and w.dtype not in (x.dtype, torch.float32):
        return original_forward(self)(x)
    return _promote(tritonkit.layer_norm(x, self.normalized_shape, w, b, self.eps), x, w)


def _add_norm(norm: nn.Module, x: torch.Tensor, residual: torch.Tensor):
    """``(norm(x + residual), x + residual)``, in one pass where tritonkit has the fused form
    for this norm and these dtypes."""
    w = getattr(norm, "weight", None)
    same = x.dtype == residual.dtype and x.shape == residual.shape
    if same and w is not None and w.dtype in (x.dtype, torch.float32):
        if type(norm).__name__ in RMS_NORMS:
            out, h = tritonkit.add_rms_norm(x, residual, w, norm.variance_epsilon)
            return _promote(out, x, w), h
        if isinstance(norm, nn.LayerNorm) and len(norm.normalized_shape) == 1:
            b = norm.bias
            if b is None or b.dtype == w.dtype:
                out, h = tritonkit.add_layer_norm(x, residual, w, b, norm.eps)
                return _promote(out, x, w), h
    h = residual + x
    return norm(h), h


def llama_layer_forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
    if args:  # positional extras: the class's own forward knows their order
        return original_forward(self)(hidden_states, *args, **kwargs)
    residual = hidden_states
    h = self.input_layernorm(hidden_states)
    h, _ = self.self_attn(hidden_states=h, **kwargs)
    normed, h = _add_norm(self.post_attention_layernorm, h, residual)
    return h + self.mlp(normed)


class Binder:
    """``inspect.Signature.bind`` for one forward, reduced to what torch.compile traces without
    a graph break: positional arguments named by position, keywords as given, the extra
    keywords (``**kwargs``) collected."""

    def __init__(self, fn: Callable) -> None:
        params = list(inspect.signature(fn).parameters.values())[1:]  # without self
        kinds = inspect.Parameter
        self.names = [
            p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        self.named = set(self.names) | {p.name for p in params if p.kind is kinds.KEYWORD_ONLY}
        self.has_var_args = any(p.kind is kinds.VAR_POSITIONAL for p in params)

    def bind(self, args: tuple, kwargs: dict) -> tuple[dict, dict] | None:
        """(named arguments, extra keywords), or None when the call does not fit."""
        if len(args) > len(self.names) or self.has_var_args:
            return None
        named = dict(zip(self.names, args))
        extra = {}
        for k, v in kwargs.items():
            if k in named:
                return None
            if k in self.named:
                named[k] = v
            else:
                extra[k] = v
        return named, extra


def _pre_norm_block_forward(binder: Binder) -> Callable:
    """GPT-2's block: ``h = x + attn(ln_1(x))``, ``h + mlp(ln_2(h))``; the second add and
    ln_2 fused. Arguments are bound by the class's signature (the model passes some by
    position) and handed to the attention as the class's forward hands them."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
        bound = binder.bind((hidden_states, *args), kwargs)
        if bound is None or bound[0].get("encoder_hidden_states") is not None:
            return original_forward(self)(hidden_states, *args, **kwargs)
        named, extra = bound
        attn_kwargs = {
            k: v
            for k, v in named.items()
            if k not in ("hidden_states", "encoder_hidden_states", "encoder_attention_mask")
        }
        attn_kwargs.update(extra)
        residual = hidden_states
        attn_output, _ = self.attn(self.ln_1(hidden_states), **attn_kwargs)
        normed, h = _add_norm(self.ln_2, attn_output, residual)
        return h + self.mlp(normed)

    return forward


def _gated_mlp_forward(act: str) -> Callable:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if act == "silu":
            y = tritonkit.swiglu(gate, up)
        else:
            y = tritonkit.geglu(gate, up, "tanh" if act == "gelu_tanh" else "none")
        return self.down_proj(y)

    return forward


def _activation_forward(act: str) -> Callable:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _activate(x, act)

    return forward


def softmax_forward(self, x: torch.Tensor) -> torch.Tensor:
    return tritonkit.softmax(x, self.dim)


def cross_entropy_loss_forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if target.is_floating_point() or input.dim() > 2:
        # Class probabilities and spatial (N, C, d1, ...) inputs: tritonkit's cross-entropy
        # takes class indices over the last dim only; PyTorch computes these.
        return original_forward(self)(input, target)
    return tritonkit.cross_entropy(
        input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing
    )


def _loss_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, reduction: str
) -> torch.Tensor:
    """transformers' causal-LM loss (float32, as its ``logits.float()`` gives) on tritonkit's
    cross-entropy, which reads 16-bit logits as they are: no float32 copy of them."""
    flat = logits.reshape(-1, logits.shape[-1])
    half = logits.dtype in (torch.float16, torch.bfloat16)
    # Under autocast tritonkit's cross-entropy returns a float32 loss from 16-bit logits.
    with torch.autocast(logits.device.type, dtype=logits.dtype, enabled=half):
        loss = tritonkit.cross_entropy(flat, labels.reshape(-1), None, ignore_index, reduction)
    return loss.float()


def _causal_lm_forward(binder: Binder, base: str, logits_mode: str, lm_loss: bool) -> Callable:
    """A causal LM's forward whose loss (with labels) is computed by tritonkit's kernels:
    from the last hidden states by :func:`linear_cross_entropy` without the logits (training,
    or any mode with ``logits_mode="never"``), or from the logits it returns by tritonkit's
    cross-entropy (``logits_mode="always"``). Eval mode with ``"eval"``: the class's own."""

    def forward(self, *args: Any, **kwargs: Any):
        bound = binder.bind(args, kwargs)
        if bound is None:
            return original_forward(self)(*args, **kwargs)
        a, extra = dict(bound[0]), bound[1]
        labels = a.pop("labels", None)
        keep = a.pop("logits_to_keep", 0)
        ours = (
            labels is not None
            and lm_loss
            and isinstance(keep, int)
            and keep == 0
            and extra.get("return_dict", True) is not False
            and (self.training or logits_mode != "eval")
        )
        if not ours:
            return original_forward(self)(*args, **kwargs)
        outputs = getattr(self, base)(**a, **extra)
        hidden = outputs[0]
        ignore_index = extra.get("ignore_index", -100)
        shift_labels = extra.get("shift_labels")
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        shift_labels = shift_labels.to(hidden.device)
        head = self.get_output_embeddings()
        n_items = extra.get("num_items_in_batch")
        reduction = "mean" if n_items is None else "sum"
        logits = None
        if logits_mode == "always":
            logits = head(hidden)
            loss = _loss_from_logits(logits, shift_labels, ignore_index, reduction)
        else:
            loss = linear_cross_entropy(
                hidden, head.weight, shift_labels, head.bias, ignore_index, reduction
            )
        if n_items is not None:
            if torch.is_tensor(n_items):
                n_items = n_items.to(loss.device)
            loss = loss / n_items
        return _lm_output(outputs, loss, logits)

    return forward


def _lm_output(outputs: Any, loss: torch.Tensor, logits: torch.Tensor | None):
    """The causal-LM output class the model would return, with the base model's fields (their
    names differ across transformers versions: ``past_key_values`` or ``cache``)."""
    from transformers import modeling_outputs

    cross = "cross_attentions" in getattr(outputs, "__dataclass_fields__", {})
    name = "CausalLMOutputWithCrossAttentions" if cross else "CausalLMOutputWithPast"
    cls = getattr(modeling_outputs, name)
    fields = {
        f: getattr(outputs, f, None)
        for f in cls.__dataclass_fields__
        if f not in ("loss", "logits") and f in getattr(outputs, "__dataclass_fields__", {})
    }
    return cls(loss=loss, logits=logits, **fields)


# -- the rotary embedding, per attention module ------------------------------------------------


def _rope_function(original: Callable) -> Callable:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` on tritonkit's
    kernel, and ``original`` for any other calling convention."""

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[-1] if args else 1)
        ok = (
            unsqueeze_dim == 1
            and len(args) <= 1
            and set(kwargs) <= {"unsqueeze_dim"}
            and q.dim() == 4
            and k.dim() == 4
            and cos.dim() == 3
            and not (cos.requires_grad or sin.requires_grad)
            and cos.dtype in (q.dtype, torch.float32)
            and q.dtype == k.dtype
            and q.shape[-1] % 2 == 0
        )
        if not ok:  # another calling convention: transformers' own function
            return original(q, k, cos, sin, *args, **kwargs)
        return tritonkit.rope(q, cos, sin), tritonkit.rope(k, cos, sin)

    apply_rotary_pos_emb.tritonkit_original = original
    return apply_rotary_pos_emb


def _rope_forward(cls: type, cache: dict) -> Callable | None:
    """The class's forward, copied with its global ``apply_rotary_pos_emb`` bound to
    tritonkit's (the modeling module and the class are left as they are, so other instances,
    patched or not, never see it); None when the forward does not call that function."""
    if cls not in cache:
        inner = inspect.unwrap(cls.forward)
        original = getattr(inner, "__globals__", {}).get("apply_rotary_pos_emb")
        rope = _rope_function(original) if callable(original) else None
        cache[cls] = with_globals(cls.forward, {"apply_rotary_pos_emb": rope}) if rope else None
    return cache[cls]


# -- the walk ------------------------------------------------------------------------------------


def _binder(module: nn.Module) -> Binder:
    return Binder(type(module).forward)  # the signature follows functools.wraps to the real one


def _is_hf(module: nn.Module) -> bool:
    return type(module).__module__.startswith("transformers.")


def _attention_modules(p: Patcher) -> dict[int, tuple[Any, list[tuple[str, nn.Module]]]]:
    """Hugging Face configs with an attention implementation -> (the config, the attention
    modules that read it: ``*Attention`` modules holding it as ``config``)."""
    found: dict[int, tuple[Any, list]] = {}
    for path, m in p.model.named_modules():
        cfg = m.__dict__.get("config")
        if _is_hf(m) and hasattr(cfg, "_attn_implementation"):
            entry = found.setdefault(id(cfg), (cfg, []))
            if type(m).__name__.endswith("Attention"):
                entry[1].append((path, m))
    return found


def _patch_attention(p: Patcher) -> None:
    """Route each Hugging Face attention module whose config says sdpa (or eager without
    attention outputs) to the chosen implementation, through a copy of the config set on the
    module: the model's config (maybe shared with other models) is not changed, and the masks
    are still built for the implementation it names."""
    choice = p.options.attention
    configs = _attention_modules(p)
    if not configs:
        return
    if choice != "keep":
        from tritonkit.models import attention

        attention.register()
        name = {
            "sdpa": attention.SDPA_NAME,
            "sdpa_repeat_kv": attention.REPEAT_KV_NAME,
            "tritonkit": attention.FLASH_NAME,
        }[choice]
        if choice == "tritonkit":
            route = "tritonkit.attention"
        else:
            route = _sdpa_words(model_device(p.model))
            if choice == "sdpa_repeat_kv":
                route += ", K/V repeated"
    for cfg, modules in configs.values():
        current = cfg._attn_implementation
        if not modules:
            continue  # a config only the model-level modules read (masks, caches)
        path, m = modules[0]
        if choice == "keep":
            p.left(m, path, f"attention kept ({current!r}: patch(attention='keep'))")
        elif current in ("sdpa", "eager") and not getattr(cfg, "output_attentions", False):
            routed = copy.copy(cfg)
            # The dict form sets this config's implementation only, not its sub-configs'
            # (objects the copy shares with the original).
            routed._attn_implementation = {"": name}
            for path, m in modules:
                p.set_attr(m, "config", routed)
                p.replaced(m, path, f"attention {current!r} -> {name!r} ({route})")
        else:
            p.left(m, path, f"attention {current!r} kept (only sdpa/eager are rerouted)")


_LOSS_WHAT = {
    "eval": "loss with labels: linear + cross-entropy, no logits in training (logits='eval')",
    "always": "loss with labels: tritonkit.cross_entropy on the logits (logits='always')",
    "never": "loss with labels: linear + cross-entropy, no logits (logits='never')",
}


def apply(p: Patcher) -> None:
    """Every rule, over every module of ``p.model``."""
    o = p.options
    _patch_attention(p)
    rope_forwards: dict[type, Callable | None] = {}
    for path, m in p.model.named_modules():
        if id(m) in p.done:
            continue
        name = type(m).__name__
        kind = _tritonkit_kind(m)
        if kind is not None:
            p.already(path, kind, "a tritonkit module: its forward runs tritonkit's kernels")
            p.done.update(id(c) for c in m.modules())
            continue
        if name in CAUSAL_LMS:
            if o.loss:
                base = getattr(m, "base_model_prefix", "model")
                # Read once here: the property logs a warning on some configs, which would
                # break a torch.compile graph if read on every call.
                lm_loss = getattr(m.loss_function, "__name__", "") == "ForCausalLMLoss"
                fwd = _causal_lm_forward(_binder(m), base, o.logits, lm_loss)
                p.set_forward(m, path, fwd, _LOSS_WHAT[o.logits])
            continue
        if name.removesuffix("Attention") in _LLAMA_LIKE and name.endswith("Attention"):
            if o.rope:
                fwd = _rope_forward(type(m), rope_forwards)
                if fwd is not None:
                    p.set_forward(m, path, fwd, "rotary embedding: tritonkit.rope")
                else:
                    p.left(m, path, "rotary embedding: its forward calls no apply_rotary_pos_emb")
            continue
        if name in DECODER_LAYERS and o.residual:
            p.set_forward(
                m, path, llama_layer_forward, "post-attention residual add + RMSNorm fused"
            )
            continue
        if name in PRE_NORM_BLOCKS and o.residual:
            fwd = _pre_norm_block_forward(_binder(m))
            p.set_forward(m, path, fwd, "residual add + ln_2 LayerNorm fused")
            continue
        if name in GATED_MLPS and o.mlp:
            act = _activation_of(getattr(m, "act_fn", None) or nn.Identity())
            if act in ("silu", "gelu", "gelu_tanh"):
                glu = "swiglu" if act == "silu" else f"geglu ({act})"
                p.set_forward(m, path, _gated_mlp_forward(act), f"gated MLP: tritonkit.{glu}")
                p.done.add(id(m.act_fn))
            else:
                p.left(m, path, f"gated MLP with activation {type(m.act_fn).__name__}")
            continue
        if name in RMS_NORMS and o.norms:
            p.set_forward(m, path, hf_rms_norm_forward, "tritonkit.rms_norm")
            continue
        if isinstance(m, nn.RMSNorm) and o.norms:
            p.set_forward(m, path, rms_norm_forward, "tritonkit.rms_norm")
            continue
        if isinstance(m, nn.LayerNorm) and o.norms:
            p.set_forward(m, path, layer_norm_forward, "tritonkit.layer_norm")
            continue
        act = _activation_of(m)
        if act is not None and o.mlp:
            p.set_forward(m, path, _activation_forward(act), f"tritonkit activation ({act})")
            continue
        if isinstance(m, nn.Softmax) and m.dim is not None:
            p.set_forward(m, path, softmax_forward, "tritonkit.softmax")
            continue
        if isinstance(m, nn.CrossEntropyLoss) and o.loss:
            p.set_forward(m, path, cross_entropy_loss_forward, "tritonkit.cross_entropy")
            continue
        _report_left(p, path, m)


def _report_left(p: Patcher, path: str, m: nn.Module) -> None:
    name = type(m).__name__
    has_children = next(m.children(), None) is not None
    if name in _LEFT_REASONS or isinstance(m, (nn.Linear, nn.Embedding, nn.Dropout)):
        key = next((k for k in _LEFT_REASONS if k in name), None)
        if key is None:
            key = (
                "Linear"
                if isinstance(m, nn.Linear)
                else ("Embedding" if isinstance(m, nn.Embedding) else "Dropout")
            )
        reason = _LEFT_REASONS[key]
        if key in ("Linear", "Conv1D"):
            reason += _gemm_library(model_device(p.model))
        p.left(m, path, reason)
    elif "RotaryEmbedding" in name:
        p.left(m, path, "rotary cos/sin table, computed once per forward by PyTorch")
    elif "RMSNorm" in name or "LayerNorm" in name:
        p.left(m, path, "norm variant not recognised (e.g. a 1 + weight scale): left as is")
    elif not has_children:
        p.left(m, path, "no tritonkit rule for this module")
    elif name.endswith(("DecoderLayer", "Block", "Layer")) and _is_hf(m):
        p.left(m, path, "block of an unsupported family: its submodules are patched one by one")
    elif name.endswith("ForCausalLM") and _is_hf(m):
        p.left(m, path, "causal-LM head of an unsupported family: logits and loss as transformers")
