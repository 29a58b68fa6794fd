"""Experiment: what a one-row-per-program LayerNorm / softmax forward needs to match Liger's.

At (16384, 4096) bf16 Liger's LayerNorm forward took 3631 GB/s and our one-row launch 3187-3212
with nearly the same instructions (docs/performance.md, run 16). The sm_90a SASS of our kernel
converts the weight and bias to fp32 before it issues the row's loads, so every program waits
for L2 and then for DRAM; ours also splits the tile index into (outer, inner) with an integer
division. Minimal kernels here isolate each difference (affine first or after the row, the
division, a grid-stride loop around the body), timed interleaved with the package's kernel
(its config constants set per candidate), Liger and a device copy.

    python experiments/exp_row_launch.py --out exp_row_launch.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from tritonkit.harness.device import fingerprint
from tritonkit.harness.timing import summarize, time_interleaved
from tritonkit.ops import norm as N
from tritonkit.ops import softmax as S

SHAPE = (16384, 4096)
DTYPE = torch.bfloat16


@triton.jit
def _row_offset(row, n_iblocks, stride, DIV: tl.constexpr):
    if DIV:  # as the package's kernels: (outer, inner) from the tile index
        return (row // n_iblocks) * 0 + (row % n_iblocks) * stride
    return row * stride


@triton.jit
def _min_ln_row(
    row, x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, n_iblocks, stride, eps,
    BLOCK: tl.constexpr, AFFINE_FIRST: tl.constexpr, DIV: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    off = _row_offset(row, n_iblocks, stride, DIV)
    if AFFINE_FIRST:
        w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask).to(tl.float32)
    x = tl.load(x_ptr + off + cols, mask=mask, other=0.0).to(tl.float32)
    if not AFFINE_FIRST:
        w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = tl.math.rsqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    y = d * rstd * w + b
    tl.store(y_ptr + off + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _min_ln_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, n_iblocks, stride, eps,
    BLOCK: tl.constexpr, AFFINE_FIRST: tl.constexpr, DIV: tl.constexpr, LOOP: tl.constexpr,
):  # fmt: skip
    if LOOP:
        for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
            _min_ln_row(row, x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, n_iblocks,
                        stride, eps, BLOCK, AFFINE_FIRST, DIV)  # fmt: skip
    else:
        _min_ln_row(tl.program_id(0), x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols,
                    n_iblocks, stride, eps, BLOCK, AFFINE_FIRST, DIV)  # fmt: skip


@triton.jit
def _min_softmax_row(row, x_ptr, y_ptr, n_cols, n_iblocks, stride, BLOCK: tl.constexpr,
                     DIV: tl.constexpr):  # fmt: skip
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    off = _row_offset(row, n_iblocks, stride, DIV)
    x = tl.load(x_ptr + off + cols, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + off + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _min_softmax_kernel(x_ptr, y_ptr, n_rows, n_cols, n_iblocks, stride, BLOCK: tl.constexpr,
                        DIV: tl.constexpr, LOOP: tl.constexpr):  # fmt: skip
    if LOOP:
        for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
            _min_softmax_row(row, x_ptr, y_ptr, n_cols, n_iblocks, stride, BLOCK, DIV)
    else:
        _min_softmax_row(tl.program_id(0), x_ptr, y_ptr, n_cols, n_iblocks, stride, BLOCK, DIV)


def _configured(module, consts, fn):
    def run():
        saved = {k: getattr(module, k) for k in consts}
        for k, v in consts.items():
            setattr(module, k, v)
        try:
            return fn()
        finally:
            for k, v in saved.items():
                setattr(module, k, v)

    return run


def _ln_cases(x, w, b, eps):
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)

    def minimal(affine_first, div, loop, warps):
        def run():
            y = torch.empty_like(x)
            mean = torch.empty(rows, device=x.device, dtype=torch.float32)
            rstd = torch.empty_like(mean)
            _min_ln_kernel[(rows,)](x, w, b, y, mean, rstd, rows, cols, rows, x.stride(0), eps,
                                    BLOCK=block, AFFINE_FIRST=affine_first, DIV=div, LOOP=loop,
                                    num_warps=warps)  # fmt: skip
            return y

        return run

    ours = lambda: N.norm_fwd(x, None, w, b, 1, eps, False)  # noqa: E731
    fns = {
        "copy": lambda: torch.empty_like(x).copy_(x),
        "ours default": ours,
        "ours persistent 8/SM": _configured(N, {"FWD_PROGRAMS_PER_SM": 8}, ours),
        "ours e32": _configured(N, {"FUSED_ELEMS_PER_THREAD": 32}, ours),
    }
    try:
        from tritonkit.specs import norm as specs

        liger = specs._liger_layer_norm()
        fns["liger"] = lambda: liger(x, w, b, eps)
    except Exception as exc:  # Liger not installed: the minimal kernels still answer
        print("liger unavailable:", exc)
    for affine_first, div, loop, warps in [
        (True, False, False, 8), (False, False, False, 8), (True, True, False, 8),
        (False, True, False, 8), (False, False, True, 8), (False, True, True, 8),
        (True, False, False, 4), (False, False, False, 4), (False, True, True, 4),
    ]:  # fmt: skip
        name = (
            f"min w{warps} {'affine-first' if affine_first else 'row-first'}"
            f"{' div' if div else ''}{' loop' if loop else ''}"
        )
        fns[name] = minimal(affine_first, div, loop, warps)
    return fns


def _softmax_cases(x):
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)

    def minimal(div, loop, warps):
        def run():
            y = torch.empty_like(x)
            _min_softmax_kernel[(rows,)](x, y, rows, cols, rows, x.stride(0), BLOCK=block,
                                         DIV=div, LOOP=loop, num_warps=warps)  # fmt: skip
            return y

        return run

    fns = {
        "copy": lambda: torch.empty_like(x).copy_(x),
        "ours default": lambda: S.softmax_fwd(x, 1, False),
        "ours e16": _configured(S, {"ELEMS_PER_THREAD": 16}, lambda: S.softmax_fwd(x, 1, False)),
        "torch": lambda: torch.softmax(x, -1),
    }
    try:
        from tritonkit.specs import softmax as specs

        liger = specs._liger_softmax()
        fns["liger"] = lambda: liger(x)
    except Exception as exc:
        print("liger unavailable:", exc)
    for div, loop, warps in [
        (False, False, 8), (True, False, 8), (False, True, 8), (True, True, 8),
        (False, False, 4), (False, False, 16), (True, True, 4),
    ]:  # fmt: skip
        name = f"min w{warps}{' div' if div else ''}{' loop' if loop else ''}"
        fns[name] = minimal(div, loop, warps)
    return fns


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="exp_row_launch.json")
    args = p.parse_args()
    x = torch.randn(SHAPE, device="cuda", dtype=DTYPE)
    w = torch.randn(SHAPE[1], device="cuda", dtype=DTYPE)
    b = torch.randn(SHAPE[1], device="cuda", dtype=DTYPE)
    nbytes = 2 * x.numel() * x.element_size()
    rows = []
    cases = {"layer_norm fwd": _ln_cases(x, w, b, 1e-5), "softmax fwd": _softmax_cases(x)}
    for case, fns in cases.items():
        for fn in fns.values():
            fn()
        samples = time_interleaved(fns, rep_ms=400, min_samples=40, max_samples=120)
        for name, s in samples.items():
            st = summarize(s)
            rows.append({"case": case, "name": name, "ms": st.median, "spread": st.spread,
                         "GBps": nbytes / st.median / 1e6})  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"fingerprint": fingerprint(), "shape": SHAPE, "rows": rows}, f, indent=1)
    for r in rows:
        print(f"{r['case']:>15} {r['name']:>34} {r['GBps']:7.0f} GB/s  spread {r['spread']:.3f}")


if __name__ == "__main__":
    main()
