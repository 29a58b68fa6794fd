"""Register and spill audit of every kernel launch the specs make at their bench shapes.

Runs each operator's forward and backward on CPU tensors at every bench shape and dtype with
Triton's launch replaced by a recorder, then compiles each distinct launch (kernel, argument
types, constexprs, warps) for sm_90a and prints ptxas's registers and spills. No GPU: it
answers "does any default config spill on Hopper" for configs a sweep never looked at (fp32,
fp16, residual forms). Spills in a memory-bound kernel usually cost bandwidth.

    python experiments/spill_audit.py [--ops softmax,layer_norm] [--dtypes float32,bfloat16]

The matmul family is left out: its launches build TMA descriptors through the GPU driver.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch
import triton
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

sys.path.insert(0, os.path.dirname(__file__))
from ptxas_report import TARGET, ptxas_report

from tritonkit import _utils
from tritonkit.harness import spec as S
from tritonkit.harness.bench import _mode_callable
from tritonkit.harness.spec import parse_dtype

_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}


def _describe(fn: JITFunction, args: tuple, kwargs: dict) -> tuple[dict, dict, dict, int]:
    """(signature, constexprs, attrs, warps) of one launch, specialized as Triton would: an
    integer equal to 1 becomes a constant, integers and pointers divisible by 16 say so."""
    bound = dict(zip(fn.arg_names, args))
    bound.update({k: v for k, v in kwargs.items() if k in fn.arg_names})
    warps = kwargs.get("num_warps", 4)
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = bound.get(name, fn.params[i].default)
        if i in fn.constexprs or value is None:
            sig[name] = "constexpr"
            consts[name] = value
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + _TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            if value == 1:
                sig[name] = "constexpr"
                consts[name] = 1
            else:
                sig[name] = "i64" if abs(value) >= 2**31 else "i32"
                if value % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {name} of type {type(value).__name__}")
    return sig, consts, attrs, warps


def record_launches(specs, dtypes) -> dict[tuple, tuple]:
    """Every distinct launch of the specs' forward and backward at their bench shapes."""
    launches: dict[tuple, tuple] = {}
    where: dict[tuple, str] = {}
    context = {"case": ""}
    real_run = JITFunction.run

    def fake_run(self, *args, grid, warmup, **kwargs):
        sig, consts, attrs, warps = _describe(self, args, kwargs)
        key = (self.__name__, tuple(sig.items()), repr(sorted(consts.items())), warps)
        if key not in launches:
            launches[key] = (self, sig, consts, attrs, warps)
            where[key] = context["case"]

    JITFunction.run = fake_run
    # CPU tensors pass the ops' device checks (they never reach a kernel: launches are recorded).
    real_interpreter = _utils.interpreter_enabled
    _utils.interpreter_enabled = lambda: True
    try:
        for spec in specs:
            params = dict(spec.params[0])
            for shape in spec.shapes.bench:
                for dtype in dtypes:
                    if dtype not in spec.dtypes:
                        continue
                    inputs = spec.make_inputs(shape, dtype, torch.device("cpu"), 0)
                    modes = ("fwd", "fwd+bwd") if spec.backward else ("fwd",)
                    for mode in modes:
                        context["case"] = f"{spec.name} {shape} {S.dtype_name(dtype)} {mode}"
                        grad_idx = spec.grad_indices(inputs) if mode != "fwd" else []
                        _mode_callable(spec.impl, inputs, params, mode, grad_idx, 0)()
                    del inputs
    finally:
        JITFunction.run = real_run
        _utils.interpreter_enabled = real_interpreter
    return {k: (*v, where[k]) for k, v in launches.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="", help="comma-separated operator names (default: all)")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--spills-only", action="store_true", help="print only launches that spill")
    args = p.parse_args()
    names = [n for n in args.ops.split(",") if n] or None
    specs = [s for s in S.select(names) if s.family != "matmul"]
    dtypes = [parse_dtype(d) for d in args.dtypes.split(",")]
    launches = record_launches(specs, dtypes)
    print(f"{len(launches)} distinct launches", flush=True)
    for fn, sig, consts, attrs, warps, case in launches.values():
        src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        try:
            kernel = triton.compile(src, target=TARGET, options={"num_warps": warps})
            report = ptxas_report(kernel)
        except Exception as exc:  # one failing case should not hide the rest
            report = f"FAILED {type(exc).__name__}: {str(exc)[:200]}"
        spills = "spill stores" in report and not report.startswith("0 bytes spill stores")
        if args.spills_only and not spills:
            continue
        flags = {k: v for k, v in consts.items() if k.isupper()}
        print(f"{'SPILL ' if spills else ''}{case} | {fn.__name__} w{warps} {flags} | {report}")


if __name__ == "__main__":
    main()
