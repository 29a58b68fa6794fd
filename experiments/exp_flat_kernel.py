"""Experiment: what a flat elementwise kernel needs to match PyTorch's vectorized kernel.

Relu at 256 MiB per tensor, bf16 and fp32: int32 vs int64 offsets, with and without
eviction hints, against the package kernel, torch.relu and a device copy, all interleaved.
"""

import torch
import triton
import triton.language as tl

from tritonkit.harness.timing import summarize, time_interleaved
from tritonkit.ops import elementwise as E


@triton.jit
def _relu_flat(x_ptr, y_ptr, n, BLOCK: tl.constexpr, INT64: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * BLOCK if INT64 else pid * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    if EVICT:
        x = tl.load(x_ptr + offs, mask=mask, eviction_policy="evict_first")
    else:
        x = tl.load(x_ptr + offs, mask=mask)
    y = tl.where(x < 0, 0.0, x.to(tl.float32))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _flat(x: torch.Tensor, block: int, warps: int, int64: bool, evict: bool):
    def run():
        y = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), block),)
        _relu_flat[grid](x, y, x.numel(), BLOCK=block, INT64=int64, EVICT=evict, num_warps=warps)
        return y

    return run


def _experiment(dtype: torch.dtype) -> None:
    x = torch.randn(16384, 8192, device="cuda").to(dtype)
    nbytes = 2 * x.numel() * x.element_size()
    fns = {
        "torch.relu": lambda: torch.relu(x),
        "copy_": lambda: torch.empty_like(x).copy_(x),
        "package": lambda: E.bias_act_fwd(x, None, "relu")[0],
    }
    for block in (1024, 2048, 4096):
        warps = max(4, min(16, block * x.element_size() // 16 // 32))
        for int64 in (False, True):
            for evict in (False, True):
                name = f"B{block} w{warps} {'i64' if int64 else 'i32'}{' evict' if evict else ''}"
                fns[name] = _flat(x, block, warps, int64, evict)
    samples = time_interleaved(fns, rep_ms=400, min_samples=50, max_samples=150)
    for name, s in samples.items():
        st = summarize(s)
        gbps = nbytes / st.median / 1e6
        print(f"{dtype!s:>15} {name:>24} {gbps:7.0f} GB/s  spread {st.spread:.3f}")


def main() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        _experiment(dtype)


if __name__ == "__main__":
    main()
