"""FusionCostModel: whether fusing a group pays, from bytes, launches and the roofline.

Each kernel is costed as ``max(launch, bytes / bandwidth)`` (memory-bound work) or, for a
GEMM, ``max(launch, flops / gemm_rate, bytes / bandwidth)``. A group's unfused cost is the
sum over its kernels as PyTorch runs them (each reads its inputs and writes its output); its
fused cost is one kernel that reads the group's external inputs and writes what leaves it.
An epilogue fused into a GEMM costs the GEMM run by tritonkit (``fused_gemm_ratio`` times
cuBLAS's time) plus the epilogue's extra operands; attention costs its FLOPs at the fused
attention rate. The predicted saving is unfused - fused; a fusion is declined when it saves
less than ``min_saving_us`` and ``min_saving_frac`` of the unfused time.

``CostParams.from_profile`` takes the rates from the hardware profile (datasheet figures
derated); ``CostParams.calibrate`` measures them on the device (copy bandwidth, the time of
a one-element kernel from PyTorch and from a tritonkit launch, GEMM and attention rates, and
tritonkit's GEMM against cuBLAS's) at reference shapes, not at the shapes it then predicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx as fx

from tritonkit.fusion.analyzer import FusionAnalyzer, FusionGroup
from tritonkit.fusion.codegen import generate


@dataclass(frozen=True)
class CostParams:
    """Device rates the cost model uses."""

    bandwidth_GBps: float  # achieved DRAM bandwidth of a streaming kernel
    launch_us: float  # the shortest a PyTorch eager op takes back to back (host or GPU)
    fused_launch_us: float  # the same for a tritonkit / generated kernel
    gemm_tflops: float  # achieved 16-bit GEMM rate (cuBLAS)
    attention_tflops: float  # achieved fused attention rate (fwd)
    fused_gemm_ratio: float = 1.03  # tritonkit GEMM time / cuBLAS time, same shape
    min_saving_us: float = 0.5
    min_saving_frac: float = 0.02
    source: str = "default"

    @classmethod
    def from_profile(cls, profile=None) -> CostParams:
        """Datasheet rates of ``profile`` (the active one when None), derated to what
        streaming kernels and GEMMs reach; H100-like figures when none is known."""
        if profile is None:
            from tritonkit import _hardware

            profile = _hardware.active()
        bw = profile.dram_GBps if profile is not None and profile.dram_GBps > 1 else 3350.0
        peak = (profile.peak("bf16") if profile is not None else None) or 989.0
        return cls(0.88 * bw, 5.0, 4.0, 0.7 * peak, 0.45 * peak, source="profile")

    @classmethod
    def calibrate(cls, device: str = "cuda") -> CostParams:
        """Measure the rates on ``device`` (a few seconds on a GPU)."""
        import triton.testing

        import tritonkit

        def bench(fn) -> float:
            return triton.testing.do_bench(fn, warmup=25, rep=100) * 1e3  # us

        x = torch.empty(1 << 27, dtype=torch.bfloat16, device=device)
        y = torch.empty_like(x)
        bw = 2 * x.numel() * 2 / (bench(lambda: y.copy_(x)) * 1e-6) / 1e9
        one = torch.ones(1, device=device, dtype=torch.bfloat16)
        launch = bench(lambda: one * 2.0)
        neg = generate(["neg"], [("full", torch.bfloat16)], torch.bfloat16)
        fused_launch = bench(lambda: neg(one))
        a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        gemm = 2 * 4096**3 / (bench(lambda: a @ a) * 1e-6) / 1e12
        ratio = bench(lambda: tritonkit.linear(a, a)) / bench(
            lambda: torch.nn.functional.linear(a, a)
        )
        q = torch.randn(2, 16, 2048, 128, device=device, dtype=torch.bfloat16)
        attn_t = bench(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        )
        attn = 4 * 2 * 16 * 2048 * 2048 * 128 / 2 / (attn_t * 1e-6) / 1e12
        return cls(bw, launch, fused_launch, gemm, attn, ratio, source=f"calibrated on {device}")


def _bytes(info) -> int:
    if not info.shape or info.dtype is None:
        return 0
    return math.prod(info.shape) * info.dtype.itemsize


@dataclass(frozen=True)
class Estimate:
    unfused_us: float
    fused_us: float
    unfused_bytes: int
    fused_bytes: int
    unfused_launches: int
    fused_launches: int

    @property
    def saving_us(self) -> float:
        return self.unfused_us - self.fused_us


class FusionCostModel:
    """Predicts the time a group's fusion saves (see the module docstring)."""

    def __init__(self, params: CostParams | None = None) -> None:
        self.params = params or CostParams.from_profile()

    def kernel_us(self, nbytes: float, flops: float = 0.0, fused: bool = False) -> float:
        p = self.params
        launch = p.fused_launch_us if fused else p.launch_us
        return max(launch, nbytes / (p.bandwidth_GBps * 1e3), flops / (p.gemm_tflops * 1e6))

    def node_bytes(self, an: FusionAnalyzer, node: fx.Node) -> int:
        """What the node's kernel moves as PyTorch runs it: every tensor input once, plus
        the output (and a Linear's weight and bias)."""
        total = _bytes(an.infos[node]) + sum(_bytes(an.infos[i]) for i in node.all_input_nodes)
        if node.op == "call_module":
            total += sum(
                p.numel() * p.element_size() for p in an.gm.get_submodule(node.target).parameters()
            )
        return total

    def gemm_flops(self, an: FusionAnalyzer, node: fx.Node) -> float:
        out = an.infos[node]
        if not out.shape:
            return 0.0
        ins = [an.infos[i] for i in node.all_input_nodes]
        k = ins[0].shape[-1] if ins and ins[0].shape else 0
        return 2.0 * math.prod(out.shape) * k

    def estimate(self, an: FusionAnalyzer, g: FusionGroup) -> Estimate:
        nodes = list(g.nodes)
        if g.kind in ("epilogue", "prologue") and g.anchor not in nodes:
            nodes = [g.anchor, *nodes] if g.kind == "epilogue" else [*nodes, g.anchor]
        unfused_us = 0.0
        unfused_bytes = 0
        for n in nodes:
            b = self.node_bytes(an, n)
            flops = self.gemm_flops(an, n) if an.infos[n].kind == "gemm" else 0.0
            unfused_us += self.kernel_us(b, flops)
            unfused_bytes += b
        inside = set(nodes)
        ext = [i for n in nodes for i in n.all_input_nodes if i not in inside]
        ext = list(dict.fromkeys(ext))
        outs = [n for n in nodes if any(u not in inside for u in n.users)]
        fused_bytes = sum(_bytes(an.infos[i]) for i in ext) + sum(_bytes(an.infos[n]) for n in outs)
        if g.kind == "prologue" and g.output not in outs:
            fused_bytes += _bytes(an.infos[g.output])  # add_*_norm always stores the sum
        if g.kind == "epilogue":
            a = g.anchor
            fused_bytes += sum(
                p.numel() * p.element_size() for p in an.gm.get_submodule(a.target).parameters()
            ) if a.op == "call_module" else 0  # fmt: skip
            gemm = self.kernel_us(self.node_bytes(an, a), self.gemm_flops(an, a))
            extra = fused_bytes - self.node_bytes(an, a)
            fused_us = gemm * self.params.fused_gemm_ratio + max(0, extra) / (
                self.params.bandwidth_GBps * 1e3
            )
        elif g.kind == "attention":
            flops = 2 * self.gemm_flops(an, g.nodes[0])  # QK^T and PV, as traced (no mask)
            fused_us = max(
                self.params.fused_launch_us,
                flops / (self.params.attention_tflops * 1e6),
                fused_bytes / (self.params.bandwidth_GBps * 1e3),
            )
        else:
            fused_us = self.kernel_us(fused_bytes, fused=True)
        return Estimate(unfused_us, fused_us, unfused_bytes, fused_bytes, len(nodes), 1)

    def decide(self, est: Estimate) -> tuple[bool, str]:
        p = self.params
        need = max(p.min_saving_us, p.min_saving_frac * est.unfused_us)
        if est.saving_us < need:
            return False, f"predicted saving {est.saving_us:.2f} us < {need:.2f} us"
        return True, f"predicted saving {est.saving_us:.2f} us"
