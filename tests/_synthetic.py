"""Synthetic results documents for testing reports and the regression gate (no GPU needed)."""

from tritonkit.harness import report


def synthetic_record(op="relu", ours_ms=0.1, base_ms=0.2, shape="(16384, 8192)", rel_l2=0.001):
    nbytes = 2**29
    ours = {
        "kind": "tritonkit",
        "median": ours_ms,
        "GBps": nbytes / (ours_ms * 1e-3) / 1e9,
        "TFLOPs": None,
        "pct_copy_bw": 92.0,
        "pct_of_roofline": 92.0,
        "bottleneck": "memory",
        "peak_mem_bytes": 2**28,
    }
    base = {
        "kind": "baseline",
        "median": base_ms,
        "GBps": nbytes / (base_ms * 1e-3) / 1e9,
        "peak_mem_bytes": 2**29,
    }
    cmp = {
        "speedup": base_ms / ours_ms,
        "ci_low": 0.98 * base_ms / ours_ms,
        "ci_high": 1.02 * base_ms / ours_ms,
        "p_value": 0.001,
        "verdict": "faster",
        "flag": None,
        "n_ours": 50,
        "n_baseline": 50,
    }
    return {
        "op": op,
        "family": "elementwise",
        "params": {},
        "shape": shape,
        "dtype": "bfloat16",
        "mode": "fwd",
        "bytes": nbytes,
        "flops": 0,
        "candidates": {"tritonkit": ours, "torch": base},
        "speedup": {"torch": base_ms / ours_ms},
        "comparison": {"torch": cmp},
        "note": None,
        "correct": {"passed": True, "rel_l2": rel_l2},
    }


def synthetic_results(records=None, gpu="Test GPU"):
    fp = {
        "gpu": gpu,
        "gpu_capability": "9.0",
        "gpu_sms": 132,
        "gpu_memory_GiB": 80,
        "driver": "1",
        "cuda": "13.0",
        "torch": "2.x",
        "triton": "3.6.0",
        "python": "3.12",
        "git_commit": "abc",
        "date": "2026-11-22T00:00:00+00:00",
    }
    ceilings = {
        "profile": {"name": "Test GPU"},
        "copy_GBps": 4240.0,
        "tflops": {"bf16": 700.0, "fp32": 50.0},
        "source": "synthetic",
    }
    return report.make_results(
        kind="gpu",
        fingerprint=fp,
        ceilings=ceilings,
        checks=[],
        bench=records if records is not None else [synthetic_record()],
        seed=1,
        ops=["relu"],
    )
