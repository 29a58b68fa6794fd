"""Compile the attention kernels for sm_90a without a GPU and print ptxas's report
(registers, spills, shared memory) per kernel and tile: "does it compile for Hopper, and does
it spill" before a GPU run (the CPU interpreter compiles nothing).

    PYTHONPATH=src:experiments python experiments/ptxas_attention.py [--only NAME] [--d 128]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.pop("TRITON_INTERPRET", None)

import triton
from ptxas_report import TARGET, ptxas_report
from triton.compiler import ASTSource

from tritonkit.ops.attention import backward as B
from tritonkit.ops.attention import config as C
from tritonkit.ops.attention import decode as DEC
from tritonkit.ops.attention import forward as FWD
from tritonkit.ops.attention import naive as NAIVE

FLOATS = {"scale_log2", "scale", "dropout_p"}


def compile_kernel(
    kernel, ptr_types: dict[str, str], constexprs: dict, num_warps: int, num_stages: int
):
    """As a bf16 launch on contiguous (B, L, H, D) tensors would specialize it: head-dim
    strides of 1, other integers and pointers multiples of 16."""
    fn = kernel.fn
    constexprs = {
        **{n: 1 for n in fn.arg_names if n.startswith("stride_") and n.endswith("d")},
        **constexprs,
    }
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = ptr_types.get(name, "*bf16")
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if sig[n] != "constexpr" and (sig[n].startswith("*") or sig[n] == "i32")
    }
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(
        src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages}
    )


FP32_PTRS = {
    "lse_ptr": "*fp32",
    "delta_ptr": "*fp32",
    "lse_part_ptr": "*fp32",
    "o_part_ptr": "*fp32",
    "s_ptr": "*fp32",
    "p_ptr": "*fp32",
    "rng_ptr": "*i64",
    "cu_q_ptr": "*i32",
    "cu_k_ptr": "*i32",
}


def _meta(
    d: int,
    mask: int = 0,
    left: bool = False,
    right: bool = False,
    varlen: bool = False,
    dropout: bool = False,
) -> dict:
    return {
        "HEAD_DIM": d,
        "BLOCK_D": max(16, triton.next_power_of_2(d)),
        "MASK_KIND": mask,
        "HAS_LEFT": left,
        "HAS_RIGHT": right,
        "BOTTOM_RIGHT": varlen,
        "IS_VARLEN": varlen,
        "HAS_DROPOUT": dropout,
        "UPCAST": False,
        "PRECISION": None,
    }


def cases(d: int):
    """(name, kernel, pointer types, constexprs, warps, stages) for the kernels and tiles the
    tuner may pick at head dim d, and the other paths at their defaults."""
    ptrs = dict(FP32_PTRS)
    for causal in (False, True):
        meta = _meta(d, right=causal)
        for t in C._fwd_candidates(
            C.Problem(1, 1, 1, 1, 1, d, None, 0, -1, -1, False, False, False).block_d
        ):
            yield (
                f"fwd causal={causal} {t}",
                FWD._attn_fwd_kernel,
                ptrs,
                {**meta, "BLOCK_M": t.BLOCK_M, "BLOCK_N": t.BLOCK_N},
                t.num_warps,
                t.num_stages,
            )
        block_d = meta["BLOCK_D"]
        for t in C._dq_candidates(block_d):
            yield (
                f"bwd-dq causal={causal} {t}",
                B._attn_bwd_dq_kernel,
                ptrs,
                {**meta, "BLOCK_M": t.BLOCK_M, "BLOCK_N": t.BLOCK_N, "DELTA_ONLY": False},
                t.num_warps,
                t.num_stages,
            )
        for t in C._dkdv_candidates(block_d):
            yield (
                f"bwd-dkdv causal={causal} {t}",
                B._attn_bwd_dkdv_kernel,
                {**ptrs, "dq_ptr": "*fp32"},
                {**meta, "BLOCK_M": t.BLOCK_M, "BLOCK_N": t.BLOCK_N, "ATOMIC_DQ": False},
                t.num_warps,
                t.num_stages,
            )
    t = C._fwd_candidates(max(16, triton.next_power_of_2(d)))[0]
    full = {"BLOCK_M": t.BLOCK_M, "BLOCK_N": t.BLOCK_N}
    yield (
        "fwd window+bool mask",
        FWD._attn_fwd_kernel,
        {**ptrs, "mask_ptr": "*i1"},
        {**_meta(d, mask=1, left=True, right=True), **full},
        t.num_warps,
        t.num_stages,
    )
    yield (
        "fwd additive mask",
        FWD._attn_fwd_kernel,
        ptrs,
        {**_meta(d, mask=2), **full},
        t.num_warps,
        t.num_stages,
    )
    yield (
        "fwd varlen causal dropout",
        FWD._attn_fwd_kernel,
        ptrs,
        {**_meta(d, right=True, varlen=True, dropout=True), **full},
        t.num_warps,
        t.num_stages,
    )
    b = C._dkdv_candidates(max(16, triton.next_power_of_2(d)))[0]
    yield (
        "bwd-dkdv atomic dq, dropout",
        B._attn_bwd_dkdv_kernel,
        {**ptrs, "dq_ptr": "*fp32"},
        {
            **_meta(d, right=True, dropout=True),
            "BLOCK_M": b.BLOCK_M,
            "BLOCK_N": b.BLOCK_N,
            "ATOMIC_DQ": True,
        },
        b.num_warps,
        b.num_stages,
    )
    yield (
        "bwd-dq delta only",
        B._attn_bwd_dq_kernel,
        ptrs,
        {**_meta(d), "BLOCK_M": 128, "BLOCK_N": 64, "DELTA_ONLY": True},
        4,
        1,
    )
    dec_meta = {
        k: v
        for k, v in _meta(d, mask=1, left=True, right=True).items()
        if k not in ("BOTTOM_RIGHT", "IS_VARLEN", "HAS_DROPOUT")
    }
    for c in C._decode_candidates(dec_meta["BLOCK_D"]):
        yield (
            f"decode {c}",
            DEC._attn_decode_kernel,
            {**ptrs, "mask_ptr": "*i1"},
            {**dec_meta, "BLOCK_M": 16, "BLOCK_N": c.BLOCK_N},
            c.num_warps,
            c.num_stages,
        )
    yield (
        "merge",
        DEC._attn_merge_kernel,
        ptrs,
        {"HEAD_DIM": d, "BLOCK_D": dec_meta["BLOCK_D"], "BLOCK_S": 64},
        4,
        1,
    )
    naive = {k: v for k, v in dec_meta.items()}
    yield (
        "naive scores",
        NAIVE._naive_scores_kernel,
        {**ptrs, "mask_ptr": "*i1"},
        {**naive, "BLOCK_M": 64, "BLOCK_N": 64},
        4,
        1,
    )
    yield ("naive softmax", NAIVE._naive_softmax_kernel, ptrs, {"BLOCK": 1024}, 4, 1)
    pv = {k: v for k, v in naive.items() if k not in ("MASK_KIND", "HAS_LEFT", "HAS_RIGHT")}
    yield ("naive pv", NAIVE._naive_pv_kernel, ptrs, {**pv, "BLOCK_M": 64, "BLOCK_N": 64}, 4, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument("--d", type=int, nargs="*", default=[64, 128])
    args = parser.parse_args()
    for d in args.d:
        for name, kernel, ptrs, constexprs, warps, stages in cases(d):
            if args.only not in name:
                continue
            t0 = time.perf_counter()
            try:
                report = ptxas_report(compile_kernel(kernel, ptrs, constexprs, warps, stages))
            except Exception as exc:  # report and go on: one case's failure is the news
                report = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(f"D={d:3d} {name:55s} {report}  ({time.perf_counter() - t0:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
