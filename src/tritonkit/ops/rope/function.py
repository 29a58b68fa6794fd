"""rope: registration with torch.library, the autograd Function and the public function."""

import torch

from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops._core.registry import apply, define_op, eager_direct
from tritonkit.ops._core.validate import check_operand, check_tensor
from tritonkit.ops.rope.plan import rope_launch


@define_op("tritonkit::rope")
def _rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    return rope_launch(x, cos, sin, backward)


@_rope_op.register_fake
def _(x, cos, sin, backward):
    out = torch.empty_like(x)
    return out if out.stride(-1) == 1 else torch.empty(x.shape, dtype=x.dtype, device=x.device)


call_rope = eager_direct(_rope_op)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    if t.stride(-1) == 1 or t.shape[-1] == 1:
        return t
    LAYOUT_COPIES.count += 1
    return t.contiguous()


class RopeFunction(torch.autograd.Function):
    """The rotation; its backward is the transposed rotation of the gradient."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return call_rope(x, cos, sin, False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return call_rope(_unit_last(grad), cos, sin, True), None, None


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, "rotate half" convention (GPT-NeoX, Llama, Mistral, Qwen):
    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``, in one pass,
    with autograd for x (transformers' ``apply_rotary_pos_emb`` on one tensor).

    Args:
        x: ``(B, H, T, D)`` float32, float16 or bfloat16 on a CUDA device, D even; any
            strides (the ``(B, T, H, D)`` projection transposed is read and written in place
            of a copy).
        cos, sin: ``(B, T, D)``, ``(1, T, D)`` or ``(T, D)`` tables in x's dtype or float32,
            as a rotary embedding module returns them (both halves given); no gradient flows
            to them (ValueError if one requires it).

    Returns:
        A tensor of x's shape and dtype, laid out as x when x is dense.
    """
    op = "tritonkit.rope"
    check_tensor(op, "x", x)
    if x.dim() != 4:
        raise ValueError(f"{op}: x must be 4-D (B, H, T, D), got shape {tuple(x.shape)}")
    b, _, t, d = x.shape
    if d % 2:
        raise ValueError(f"{op}: x's head dim must be even, got {d}")
    tables = []
    for name, tab in (("cos", cos), ("sin", sin)):
        check_operand(op, name, tab, "x", x, or_float32=True)
        if tab.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{op}: {name} must not require a gradient (none is computed)")
        if tab.dim() == 2:
            tab = tab.unsqueeze(0)
        if tab.dim() != 3 or tab.shape[0] not in (1, b) or tuple(tab.shape[1:]) != (t, d):
            raise ValueError(
                f"{op}: {name} must have shape ({b}, {t}, {d}), (1, {t}, {d}) or ({t}, {d}), "
                f"got {tuple(tab.shape)}"
            )
        tables.append(_unit_last(tab.expand(b, t, d)))
    c, s = tables
    if c.stride() != s.stride():
        LAYOUT_COPIES.count += 2
        c, s = c.contiguous(), s.contiguous()
    return apply(RopeFunction, _unit_last(x), c, s)
