"""Triton kernels generated for elementwise chains.

A chain is a list of steps over values: inputs ``a0, a1, ...`` (each a full tensor of the
output's shape, a one-element tensor, or a vector along the last dim), float constants, and
earlier steps ``v0, v1, ...``. Its kernel loads each input once in float32, computes every
step in registers and stores the last one rounded once to the output dtype: one read of the
inputs and one write, where PyTorch runs a kernel per step and rounds after each. The source
is written to ``$TRITONKIT_CACHE_DIR/fusion/`` (Triton reads a kernel's source from its file)
and launched through tritonkit's launch path (``ops._core.launch.kernel``). Forward only: the
planner uses generated kernels where no gradient is needed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tritonkit.ops._core.plan import PLANS

# op -> (arity, expression over x, y)
_EXPR = {
    "add": (2, "({x} + {y})"),
    "sub": (2, "({x} - {y})"),
    "mul": (2, "({x} * {y})"),
    "div": (2, "({x} / {y})"),
    "neg": (1, "(-{x})"),
    "relu": (1, "tl.where({x} < 0.0, 0.0, {x})"),  # NaN stays NaN, as torch.relu
    "sigmoid": (1, "tl.sigmoid({x})"),
    "tanh": (1, "(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)"),
    "exp": (1, "tl.exp({x})"),
    "sqrt": (1, "tl.sqrt_rn({x})"),
    "rsqrt": (1, "tl.rsqrt({x})"),
    "square": (1, "({x} * {x})"),
    "silu": (1, "({x} * tl.sigmoid({x}))"),
    "gelu": (1, "(0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476)))"),
    # tanh(u) = 2 sigmoid(2u) - 1, u = sqrt(2 / pi) (x + 0.044715 x^3)
    "gelu_tanh": (
        1,
        "({x} * tl.sigmoid(1.5957691216057308 * ({x} + 0.044715 * {x} * {x} * {x})))",
    ),
}
KINDS = ("full", "scalar", "row")
_TL = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}


def supported(op: str) -> bool:
    return op in _EXPR


def _source(steps: Sequence, kinds: Sequence[str], name: str) -> str:
    args = ", ".join(f"in{i}_ptr" for i in range(len(kinds)))
    lines = [
        "import triton",
        "import triton.language as tl",
        "from tritonkit.ops._core.launch import kernel",
        "",
        "",
        "@kernel",
        f"def {name}({args}, out_ptr, n_elements, n_cols, BLOCK: tl.constexpr):",
        "    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        "    mask = offs < n_elements",
    ]
    for i, kind in enumerate(kinds):
        if kind == "full":
            load = f"tl.load(in{i}_ptr + offs, mask=mask)"
        elif kind == "scalar":
            load = f"tl.load(in{i}_ptr)"
        else:
            load = f"tl.load(in{i}_ptr + offs % n_cols, mask=mask)"
        lines.append(f"    a{i} = {load}.to(tl.float32)")
    for j, (op, operands) in enumerate(steps):
        vals = [o if isinstance(o, str) else repr(float(o)) for o in operands]
        arity, expr = _EXPR[op]
        x = vals[0]
        y = vals[1] if arity == 2 else None
        lines.append(f"    v{j} = {expr.format(x=x, y=y)}")
    last = f"v{len(steps) - 1}"
    lines.append(f"    tl.store(out_ptr + offs, {last}.to(out_ptr.dtype.element_ty), mask=mask)")
    return "\n".join(lines) + "\n"


def _load(source: str, name: str) -> Callable:
    root = Path(os.environ.get("TRITONKIT_CACHE_DIR", Path.home() / ".cache" / "tritonkit"))
    folder = root / "fusion"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        tmp.replace(path)
    spec = importlib.util.spec_from_file_location(f"tritonkit_fusion_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def generate(
    steps: Sequence,
    inputs: Sequence[tuple[str, torch.dtype]],
    out_dtype: torch.dtype,
    block: int = 1024,
) -> Callable[..., torch.Tensor]:
    """A function computing the chain: ``fn(*input_tensors) -> output``.

    Args:
        steps: ``(op, operands)`` pairs; an operand is ``"a<i>"`` (input i), ``"v<j>"`` (step
            j < this one) or a float. A bare op name as a step means ``(op, ["a0"])`` when
            it is the first step, else ``(op, ["v<previous>"])``.
        inputs: ``(kind, dtype)`` per input, kind in ``"full"`` (the output's shape,
            contiguous), ``"scalar"`` (one element) or ``"row"`` (a vector along the last dim).
        out_dtype: float32, float16 or bfloat16.
        block: elements per program.

    The output has the shape of the first ``full`` input; inputs are made contiguous if
    they are not.
    """
    norm = []
    for j, s in enumerate(steps):
        if isinstance(s, str):
            s = (s, ["a0" if j == 0 else f"v{j - 1}"])
        op, operands = s
        if op not in _EXPR:
            raise ValueError(f"tritonkit.fusion.generate: op {op!r} has no generated form")
        norm.append((op, list(operands)))
    for kind, dt in inputs:
        if kind not in KINDS or dt not in _TL:
            raise ValueError(f"tritonkit.fusion.generate: input ({kind}, {dt}) not supported")
    if out_dtype not in _TL:
        raise ValueError(f"tritonkit.fusion.generate: out_dtype {out_dtype} not supported")
    kinds = [k for k, _ in inputs]
    key = repr((norm, kinds))
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    name = f"fused_{digest}"
    k = PLANS.get(("fusion.kernel", name), None, lambda: _load(_source(norm, kinds, name), name))
    full = kinds.index("full") if "full" in kinds else None

    def run(*tensors: torch.Tensor) -> torch.Tensor:
        ref = tensors[full] if full is not None else tensors[0]
        ts = [t if t.is_contiguous() else t.contiguous() for t in tensors]
        out = torch.empty(ref.shape, dtype=out_dtype, device=ref.device)
        n = out.numel()
        if n == 0:
            return out
        n_cols = ref.shape[-1] if ref.dim() else 1
        k[(triton_cdiv(n, block),)](*ts, out, n, n_cols, BLOCK=block)
        return out

    run.source = _source(norm, kinds, name)
    return run


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
