"""Compile tritonkit kernels for sm_90a on a machine without a GPU and print ptxas's resource
report (registers, spills, shared memory) and SASS instruction counts. The workbench does the
same per kernel an operator launches (harness/kernel_stats.py, ``tritonkit profile``); this
script keeps the hand-written cases (a kernel at chosen constexprs) and the SASS counts.

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
from triton.runtime.jit import JITFunction

from tritonkit.harness.kernel_stats import ptxas_log, ptxas_stats  # noqa: F401  (re-exported)
from tritonkit.ops.norm.config import NORM, WIDE_STAGES_RMS
from tritonkit.ops.norm.kernels_backward import norm_bwd_kernel
from tritonkit.ops.norm.kernels_backward_wide import norm_bwd_sums_kernel
from tritonkit.ops.norm.kernels_forward_looped import norm_fwd_looped_kernel
from tritonkit.ops.norm.kernels_forward_row import norm_fwd_row_kernel
from tritonkit.ops.norm.kernels_forward_tiles import norm_fwd_tiles_kernel
from tritonkit.ops.softmax.kernels_aligned import (
    softmax_bwd_aligned_kernel,
    softmax_fwd_aligned_kernel,
)
from tritonkit.ops.softmax.kernels_looped import (
    softmax_bwd_looped_kernel,
    softmax_fwd_looped_kernel,
)
from tritonkit.ops.softmax.kernels_row_backward import softmax_bwd_row_kernel
from tritonkit.ops.softmax.kernels_tiles import softmax_fwd_tiles_kernel

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
    """Compiled as a launch on the bench shapes would be: column strides (and the per-row
    statistics' inner stride) of 1 are constants (Triton specializes integer arguments equal
    to 1), pointers and the other integers are multiples of 16. ``fn``: a ``triton.jit``
    function or a tritonkit ``@kernel``."""
    if not isinstance(fn, JITFunction):  # a tritonkit @kernel: the JIT function it wraps
        fn = fn.fn
    constexprs = {
        **{n: 1 for n in fn.arg_names if re.fullmatch(r"stride_(\w*n|w|b|si)", n)},
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
    return " ".join(
        re.findall(r"Used \d+ registers|\d+ bytes spill \w+|\d+ bytes smem", ptxas_log(kernel))
    )


def sass_text(kernel) -> str:
    """The cubin's SASS, code only (Triton's nvdisasm)."""
    nvdisasm = os.path.join(
        os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm"
    )
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        out = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True)
    return out.stdout


def sass_counts(kernel) -> dict[str, int]:
    """Instructions per opcode in the cubin's SASS."""
    counts: dict[str, int] = {}
    for line in sass_text(kernel).splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            op = m.group(1).split(".")[0]
            counts[op] = counts.get(op, 0) + 1
    return counts


BF16 = {"x_ptr": "*bf16", "y_ptr": "*bf16", "dy_ptr": "*bf16", "dx_ptr": "*bf16"}
BF16 |= {"r_ptr": "*bf16", "h_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16"}
BF16 |= {"dres_ptr": "*bf16", "eps": "fp32"}


def _norm_row_fwd(rms: bool, n_cols: int, block_n: int, thread_elems: int) -> dict:
    """norm_fwd_row_kernel (rows without a residual, 1536-65536 columns)."""
    return {
        "N_COLS": n_cols,
        "IS_RMS": rms,
        "SHIFT": False,  # 16-bit rows (config.shifts)
        "HAS_WEIGHT": True,
        "HAS_BIAS": not rms,
        "OUTER": False,
        "WELFORD": False,
        "SCALE_FIRST": not rms,
        "STORE": "evict_first" if not rms or n_cols > 32768 else "",
        "BLOCK_N": block_n,
        "THREAD_ELEMS": thread_elems,
    }


def _norm_tiles_fwd(rms: bool, block_n: int) -> dict:
    """norm_fwd_tiles_kernel with a residual: a row in registers, one tile per program."""
    return {
        "IS_RMS": rms,
        "SHIFT": False,
        "HAS_RESIDUAL": True,
        "HAS_WEIGHT": True,
        "HAS_BIAS": not rms,
        "PREFETCH": False,
        "REREAD": False,
        "STAGES": None,
        "EVEN_N": True,
        "OUTER": False,
        "ONE_TILE": True,
        "INT64": False,
        "BLOCK_R": 1,
        "BLOCK_N": block_n,
    }


def _norm_looped_fwd(rms: bool, block_n: int) -> dict:
    """norm_fwd_looped_kernel with a residual (16-bit: per-chunk statistics, L2 hints)."""
    return {
        "IS_RMS": rms,
        "SHIFT": False,
        "HAS_RESIDUAL": True,
        "HAS_WEIGHT": True,
        "HAS_BIAS": not rms,
        "LOOP_PREFETCH": not rms,
        "LOOP_STATS": 0,
        "KEEP": "evict_last",
        "SUM_FIRST": False,
        "DROP": "evict_first",
        "OUTER": False,
        "ONE_TILE": False,
        "INT64": False,
        "BLOCK_R": 1,
        "BLOCK_N": block_n,
    }


def _norm_bwd(rms: bool, block_n: int, block_r: int, wide: bool) -> dict:
    """norm_bwd_kernel: rows in registers through the compiler's pipeline, or (wide) one
    column block with the row sums given by norm_bwd_sums_kernel."""
    bc = NORM.backward.registers
    return {
        "IS_RMS": rms,
        "SHIFT": False,
        "HAS_WEIGHT": True,
        "HAS_DRES": False,
        "WEIGHT_GRAD": True,
        "BIAS_GRAD": not rms,
        "SUMS_GIVEN": wide,
        "PREFETCH": wide and not rms,  # LayerNorm's wide pass: by hand; else the pipeline
        "REDUCE_TILES": block_r > 1 and not rms,
        "STAGES": None if wide and not rms else bc.stages if rms or wide else bc.stages_ln,
        "OUTER": False,
        "INT64": False,
        "BLOCK_R": block_r,
        "BLOCK_N": block_n,
    }


def _norm_bwd_sums(rms: bool, block_n: int) -> dict:
    return {
        "IS_RMS": rms,
        "SHIFT": False,
        "HAS_WEIGHT": True,
        "STAGES": WIDE_STAGES_RMS if rms else None,
        "OUTER": False,
        "INT64": False,
        "BLOCK_R": 1,
        "BLOCK_N": block_n,
    }


def _softmax_rows(block_n: int) -> dict:
    """softmax_{fwd,bwd}_tiles_kernel: a row in registers, one tile per program."""
    return {"LOG": False, "OUTER": False, "ONE_TILE": True, "INT64": False, "BLOCK_R": 1,
            "BLOCK_N": block_n}  # fmt: skip


def _softmax_looped(block_n: int, backward: bool) -> dict:
    flags = {"LOG": False, "PREFETCH": backward, "KEEP": "evict_last", "DROP": "evict_first"}
    if not backward:
        flags["CHUNK_MAX"] = True
    return {**flags, "OUTER": False, "ONE_TILE": False, "INT64": False, "BLOCK_R": 1,
            "BLOCK_N": block_n}  # fmt: skip


def cases() -> dict[str, tuple]:
    """The bench shapes' default launches, bf16 (as spill_audit.py records them): the norms
    at (16384, 4096) and (4096, 65536), their residual forms (rows in registers, and looped in
    chunks of 16384, with the looped forward's statistics, L2 hints and elements per thread
    varied), softmax at (16384, 4096), (4096, 65536) and (1335, 50257)."""
    out = {}
    for rms in (True, False):
        name = "rms" if rms else "ln"
        out[f"{name}_fwd row 4096/{8 if rms else 4}w"] = (
            norm_fwd_row_kernel, BF16, _norm_row_fwd(rms, 4096, 4096 if rms else 1024, 0),
            8 if rms else 4,
        )  # fmt: skip
        out[f"{name}_fwd row 65536/32w"] = (
            norm_fwd_row_kernel, BF16, _norm_row_fwd(rms, 65536, 8192, 0 if rms else 8), 32,
        )  # fmt: skip
        out[f"add_{name}_fwd tiles 4096/8w"] = (
            norm_fwd_tiles_kernel, BF16, _norm_tiles_fwd(rms, 4096), 8,
        )  # fmt: skip
        warps = 16 if rms else 32
        out[f"add_{name}_fwd looped 16384/{warps}w"] = (
            norm_fwd_looped_kernel, BF16, _norm_looped_fwd(rms, 16384), warps,
        )  # fmt: skip
        for stats, evict, ept in itertools.product((0, 1), (False, True), (16, 32)):
            flags = _norm_looped_fwd(rms, 16384) | {"LOOP_STATS": stats}
            if not evict:
                flags |= {"KEEP": "", "DROP": ""}
            out[f"add_{name}_fwd looped stats {stats} evict {evict:d} {ept}/thread"] = (
                norm_fwd_looped_kernel, BF16, flags, 16384 // 32 // ept,
            )  # fmt: skip
        out[f"{name}_bwd 2x4096/16w"] = (
            norm_bwd_kernel, BF16, _norm_bwd(rms, 4096, 2, False), 16,
        )  # fmt: skip
        out[f"{name}_bwd sums 8192/16w"] = (
            norm_bwd_sums_kernel, BF16, _norm_bwd_sums(rms, 8192), 16,
        )  # fmt: skip
        out[f"{name}_bwd wide 4096/8w"] = (
            norm_bwd_kernel, BF16, _norm_bwd(rms, 4096, 1, True), 8,
        )  # fmt: skip
    out["softmax_fwd 4096/4w"] = (softmax_fwd_tiles_kernel, BF16, _softmax_rows(4096), 4)
    out["softmax_bwd row 4096/16w"] = (
        softmax_bwd_row_kernel, BF16,
        {"N_COLS": 4096, "LOG": False, "OUTER": False, "BLOCK_N": 4096}, 16,
    )  # fmt: skip
    out["softmax_fwd looped 16384/16w"] = (
        softmax_fwd_looped_kernel, BF16, _softmax_looped(16384, False), 16,
    )  # fmt: skip
    out["softmax_bwd looped 16384/32w"] = (
        softmax_bwd_looped_kernel, BF16, _softmax_looped(16384, True), 32,
    )  # fmt: skip
    aligned = {"LOG": False, "OUTER": False, "VEC": 8, "BLOCK_N": 8192}
    out["softmax_fwd aligned 8192/8w"] = (softmax_fwd_aligned_kernel, BF16, aligned, 8)
    out["softmax_bwd aligned 8192/32w"] = (softmax_bwd_aligned_kernel, BF16, aligned, 32)
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
            print(f"{name:46s} FAILED {type(exc).__name__}: {str(exc)[:300]}")
            continue
        line = f"{name:46s} {ptxas_report(kernel)}"
        if args.sass:
            c = sass_counts(kernel)
            line += f"  SASS {sum(c.values())} instr"
        print(line)


if __name__ == "__main__":
    main()
