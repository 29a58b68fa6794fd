"""Register and spill audit of every kernel launch the specs make at their bench shapes.

Runs each operator's forward and backward on CPU tensors at every bench shape and dtype with
the kernels' launch replaced by a recorder (``Kernel._launch`` in ops/_core/launch.py, which
every ``@kernel`` launch, direct or ``Bound``, goes through; nothing is launched), then
compiles each distinct launch for sm_90a and prints ptxas's registers and spills. No GPU: it
answers "does any default config spill on Hopper" for configs a sweep never looked at (fp32,
fp16, residual forms). Spills in a memory-bound kernel usually cost bandwidth.

    python experiments/spill_audit.py [--ops softmax,layer_norm] [--dtypes float32,bfloat16]
        [--spills-only] [--digest FILE]
    python experiments/spill_audit.py --compare A.json B.json

By default every operator, each in every dtype its spec has (350 distinct launches, about 13
minutes on a 2-core CPU machine with Triton's cache cold, 5 of them making inputs and
recording).

A launch is specialized by Triton's own binder for the CUDA backend (pointer dtypes and 16-byte
alignment, integers equal to 1 or divisible by 16, constexpr values, warps, stages and other
options), so each compiles as it would on the GPU. The ops run as on an H100: the interpreter's
code paths off (TRITON_INTERPRET unset; only the device checks accept CPU tensors), 132 SMs and
227 KiB of shared memory per block (``--sms``, ``--smem``), ``Tensor.is_cuda`` true during the
calls (cross_entropy's rows kernel and varlen attention compile their device-side asserts in on
CUDA), TMA where a Hopper GPU takes it (the GEMMs make their descriptors on the device, so the
matmul family needs no driver here), autotuning off (each kernel's heuristic default,
TRITONKIT_AUTOTUNE=0: a GPU whose tuning cache holds other tiles launches those). Attention is
recorded like every other family.

``--digest FILE`` writes JSON: for each distinct launch (its key: kernel, signature with
alignment, constexprs, warps, stages, other options) the registers, spill bytes, shared
memory, SASS instruction count, the sha256 of the SASS (nvdisasm, the kernel's name replaced)
and the first case that made it. ``--compare A B`` lists the launches whose SASS differs
between two digests or that only one of them has (exit status 1 if any): run on the tree
before and after a change that should not change the compiled code (a kernel split into
helpers). The SASS depends on the debug line info too: labels that an inlined helper's scope
adds to the PTX can change ptxas's register choice with the PTX instructions unchanged.

Left out: distributed specs (they need ranks) and any spec whose calls fail on the CPU (the
failure is printed and the audit goes on).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITONKIT_AUTOTUNE"] = "0"  # nothing can be timed: each kernel's default config

import torch

sys.path.insert(0, os.path.dirname(__file__))
from ptxas_report import sass_text

from tritonkit.harness import spec as S
from tritonkit.harness.bench import _mode_callable
from tritonkit.harness.kernel_stats import (  # the recording and compiling are the workbench's
    H100_SMEM,
    H100_SMS,
    Launch,
    as_on_gpu,
    ptxas_stats,
    recording,
)
from tritonkit.harness.spec import parse_dtype


def record_launches(specs, dtypes, sms: int, smem: int) -> dict[str, tuple[Launch, str]]:
    """Every distinct launch of the specs' forward and backward at their bench shapes, with
    the first case that made it."""
    launches: dict[str, tuple[Launch, str]] = {}
    binders: dict = {}
    context = {"case": ""}

    def on_launch(fn, args, meta, grid):
        launch = Launch(fn, args, meta, binders)
        launches.setdefault(launch.key(), (launch, context["case"]))

    for spec in specs:
        if spec.distributed is not None:
            print(f"skipped {spec.name}: distributed", flush=True)
            continue
        params = dict(spec.params[0])
        for shape in spec.shapes.bench:
            for dtype in dtypes or spec.dtypes:
                if dtype not in spec.dtypes:
                    continue
                inputs = spec.make_inputs(shape, dtype, torch.device("cpu"), 0)
                modes = ("fwd", "fwd+bwd") if spec.backward else ("fwd",)
                for mode in modes:
                    context["case"] = f"{spec.name} {shape} {S.dtype_name(dtype)} {mode}"
                    grad_idx = spec.grad_indices(inputs) if mode != "fwd" else []
                    try:
                        with as_on_gpu(sms, smem), recording(on_launch):
                            _mode_callable(spec.impl, inputs, params, mode, grad_idx, 0)()
                    except Exception as exc:  # report and go on
                        print(
                            f"FAILED {context['case']}: {type(exc).__name__}: {str(exc)[:300]}",
                            flush=True,
                        )
                del inputs
    return launches


def named_sass(kernel) -> str:
    """The cubin's SASS with the kernel's name replaced by KERNEL (comparable across trees)."""
    return re.sub(rf"\b{re.escape(kernel.metadata.name)}\b", "KERNEL", sass_text(kernel))


def sass_instructions(text: str) -> int:
    return len(re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s+\S", text, flags=re.MULTILINE))


def audit(launches: dict[str, tuple[Launch, str]], spills_only: bool) -> dict[str, dict]:
    digest = {}
    for key, (launch, case) in launches.items():
        name = launch.fn.__name__
        try:
            kernel = launch.compile()
            stats = ptxas_stats(kernel)
            sass = named_sass(kernel)
        except Exception as exc:  # one failing case should not hide the rest
            print(f"FAILED {case} | {key} | {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        entry = {
            "registers": stats["registers"],
            "spill_stores": stats["spill_stores"],  # bytes
            "spill_loads": stats["spill_loads"],
            "shared": kernel.metadata.shared,  # bytes of shared memory a program takes
            "instructions": sass_instructions(sass),
            "sass_sha256": hashlib.sha256(sass.encode()).hexdigest(),
            "case": case,
        }
        digest[key] = entry
        spills = stats["spill_stores"] > 0 or stats["spill_loads"] > 0
        if spills_only and not spills:
            continue
        flags = {
            launch.fn.arg_names[p[0]]: getattr(v, "value", v)
            for p, v in launch.constexprs.items()
            if launch.fn.arg_names[p[0]].isupper()
        }
        warps = launch.options["num_warps"]
        report = (
            f"{stats['registers']} registers, spills {stats['spill_stores']} bytes stored "
            f"{stats['spill_loads']} loaded, {entry['shared']} bytes shared"
        )
        print(
            f"{'SPILL ' if spills else ''}{case} | {name} w{warps} {flags} | {report}", flush=True
        )
    return digest


def compare(path_a: str, path_b: str) -> int:
    """Print the launches whose SASS differs or that only one digest has; 1 if any, else 0."""
    with open(path_a) as f:
        a = json.load(f)
    with open(path_b) as f:
        b = json.load(f)
    only_a = [k for k in a if k not in b]
    only_b = [k for k in b if k not in a]
    both = [k for k in a if k in b]
    differ = [k for k in both if a[k]["sass_sha256"] != b[k]["sass_sha256"]]
    for k in only_a:
        print(f"only in {path_a}: {k}")
    for k in only_b:
        print(f"only in {path_b}: {k}")
    for k in differ:
        x, y = a[k], b[k]
        print(f"SASS differs: {k}\n  ({x['case']})")
        for field in ("registers", "spill_stores", "spill_loads", "shared", "instructions"):
            mark = "" if x.get(field) == y.get(field) else "  <-"
            print(f"  {field}: {x.get(field)} -> {y.get(field)}{mark}")
    print(
        f"{len(both)} launches in both, {len(both) - len(differ)} with identical SASS, "
        f"{len(differ)} differing; {len(only_a)} only in {path_a}, {len(only_b)} only in "
        f"{path_b}"
    )
    return 1 if differ or only_a or only_b else 0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="", help="comma-separated operator or family names (all)")
    p.add_argument("--dtypes", default="", help="comma-separated dtypes (default: each spec's)")
    p.add_argument("--spills-only", action="store_true", help="print only launches that spill")
    p.add_argument(
        "--digest",
        metavar="FILE",
        help="write each launch's registers, spills and SASS digest as JSON",
    )
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two digests")
    p.add_argument("--sms", type=int, default=H100_SMS, help="SMs the launch configs see")
    p.add_argument("--smem", type=int, default=H100_SMEM, help="shared memory per block")
    args = p.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    names = [n for n in args.ops.split(",") if n] or None
    specs = S.select(names)
    dtypes = [parse_dtype(d) for d in args.dtypes.split(",") if d] or None
    launches = record_launches(specs, dtypes, args.sms, args.smem)
    print(f"{len(launches)} distinct launches", flush=True)
    digest = audit(launches, args.spills_only)
    if args.digest:
        with open(args.digest, "w") as f:
            json.dump(digest, f, indent=1, sort_keys=True)
        print(f"{len(digest)} launches written to {args.digest}")


if __name__ == "__main__":
    main()
