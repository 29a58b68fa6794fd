"""Compile tritonkit kernels for sm_90a on a machine without a GPU and print ptxas's resource
report (registers, spills, shared memory) and SASS instruction counts.

Triton ships ptxas and nvdisasm; compiling needs no GPU. This answers "does it compile for
Hopper" (the CPU interpreter does not compile) and "how many programs fit on an SM" before a
GPU run. Each case is a kernel with its argument types and constexprs:

    python experiments/ptxas_report.py [--sass] [--only NAME]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tritonkit.ops import norm as N
from tritonkit.ops import softmax as S

TARGET = GPUTarget("cuda", 90, 32)


def _signature(fn, types: dict[str, str], constexprs: dict) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in types:
            sig[name] = types[name]
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_case(fn, types: dict[str, str], constexprs: dict, num_warps: int):
    """Compiled as a launch on the bench shapes would be: column strides of 1 are constants
    (Triton specializes integer arguments equal to 1), pointers and the other integers are
    multiples of 16."""
    constexprs = {
        **{n: 1 for n in fn.arg_names if re.fullmatch(r"stride_(\w*n|w|b)", n)},
        **constexprs,
    }
    sig = _signature(fn, types, constexprs)
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if sig[n] != "constexpr" and (sig[n].startswith("*") or sig[n] == "i32")
    }
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps})


def ptxas_report(kernel) -> str:
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(kernel.asm["ptx"])
        out = subprocess.run(
            [ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.path.join(d, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        )
    return " ".join(
        re.findall(r"Used \d+ registers|\d+ bytes spill \w+|\d+ bytes smem", out.stderr)
    )


def sass_counts(kernel) -> dict[str, int]:
    """Instructions per opcode in the cubin's SASS (nvdisasm)."""
    nvdisasm = os.path.join(
        os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm"
    )
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        text = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True)
    counts: dict[str, int] = {}
    for line in text.stdout.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            op = m.group(1).split(".")[0]
            counts[op] = counts.get(op, 0) + 1
    return counts


BF16 = {"x_ptr": "*bf16", "y_ptr": "*bf16", "dy_ptr": "*bf16", "dx_ptr": "*bf16"}
BF16 |= {"r_ptr": "*bf16", "h_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16"}
BF16 |= {"dres_ptr": "*bf16", "part_ptr": "*i64", "eps": "fp32"}


def _norm_fwd(rms: bool, looped: bool, block_n: int) -> dict:
    return {
        "IS_RMS": rms,
        "SHIFT": not rms and looped,
        "HAS_RESIDUAL": False,
        "HAS_WEIGHT": True,
        "HAS_BIAS": not rms,
        "LOOPED": looped,
        "PREFETCH": False,
        "LOOP_PREFETCH": looped,
        "LOOP_STATS": 1 if rms else 0,
        "KEEP": "",
        "DROP": "",
        "REREAD": not looped,
        "STAGES": None,
        "SUM_FIRST": False,
        "EVEN_N": not looped,
        "OUTER": False,
        "ONE_TILE": not looped,
        "INT64": False,
        "BLOCK_R": 1,
        "BLOCK_N": block_n,
    }


def _softmax(looped: bool, block_n: int, backward: bool) -> dict:
    flags = {"LOG": False, "LOOPED": looped, "KEEP": "", "DROP": ""}
    if looped:
        flags |= {"PREFETCH": backward, "KEEP": "evict_last", "DROP": "evict_first"}
    else:
        flags |= {"PREFETCH": False}
    if not backward:
        flags |= {"CHUNK_MAX": looped}
    return {**flags, "OUTER": False, "ONE_TILE": not looped, "INT64": False, "BLOCK_R": 1,
            "BLOCK_N": block_n}  # fmt: skip


def _norm_bwd(rms: bool, block_n: int, block_r: int) -> dict:
    return {
        "IS_RMS": rms,
        "SHIFT": False,
        "HAS_WEIGHT": True,
        "HAS_DRES": False,
        "WEIGHT_GRAD": True,
        "BIAS_GRAD": not rms,
        "SUMS_GIVEN": False,
        "PREFETCH": False,  # the compiler's pipeline instead (norm.BWD_STAGES)
        "REDUCE_TILES": block_r > 1 and not rms,
        "STAGES": N.BWD_STAGES if rms else N.BWD_STAGES_LN,
        "OUTER": False,
        "INT64": False,
        "BLOCK_R": block_r,
        "BLOCK_N": block_n,
    }


def cases() -> dict[str, tuple]:
    """The bench shapes' default launches, bf16: (4096, 65536) looped in chunks of 16384,
    (16384, 4096) in registers (the norm backward two rows per tile)."""
    out = {}
    for rms in (True, False):
        name = "rms" if rms else "ln"
        warps = 16 if rms else 32
        out[f"{name}_fwd looped 16384/{warps}w"] = (
            N._norm_fwd_kernel, BF16, _norm_fwd(rms, True, 16384), warps,
        )  # fmt: skip
        for stats, evict, ept in itertools.product((0, 1), (False, True), (16, 32)):
            flags = _norm_fwd(rms, True, 16384) | {"LOOP_STATS": stats}
            if evict:
                flags |= {"KEEP": "evict_last", "DROP": "evict_first"}
            out[f"{name}_fwd looped stats {stats} evict {evict:d} {ept}/thread"] = (
                N._norm_fwd_kernel, BF16, flags, 16384 // 32 // ept,
            )  # fmt: skip
        out[f"{name}_fwd 4096/8w"] = (N._norm_fwd_kernel, BF16, _norm_fwd(rms, False, 4096), 8)
        out[f"{name}_bwd 2x4096/16w"] = (N._norm_bwd_kernel, BF16, _norm_bwd(rms, 4096, 2), 16)
    out["softmax_fwd looped 16384/16w"] = (
        S._softmax_fwd_kernel,
        BF16,
        _softmax(True, 16384, False),
        16,
    )
    out["softmax_bwd looped 16384/32w"] = (
        S._softmax_bwd_kernel,
        BF16,
        _softmax(True, 16384, True),
        32,
    )
    out["softmax_fwd 4096/4w"] = (S._softmax_fwd_kernel, BF16, _softmax(False, 4096, False), 4)
    out["softmax_bwd 4096/4w"] = (S._softmax_bwd_kernel, BF16, _softmax(False, 4096, True), 4)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sass", action="store_true", help="also count SASS instructions")
    p.add_argument("--only", default="", help="substring of the case names to compile")
    args = p.parse_args()
    for name, (fn, types, consts, warps) in cases().items():
        if args.only not in name:
            continue
        try:
            kernel = compile_case(fn, types, consts, warps)
        except Exception as exc:  # report and go on: one failing case should not hide the rest
            print(f"{name:36s} FAILED {type(exc).__name__}: {str(exc)[:300]}")
            continue
        line = f"{name:36s} {ptxas_report(kernel)}"
        if args.sass:
            c = sass_counts(kernel)
            line += f"  SASS {sum(c.values())} instr"
        print(line)


if __name__ == "__main__":
    main()
