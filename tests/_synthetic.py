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


# ---- a GPU results document with every column and case the report renders --------------------


def _candidate(kind, ms, nbytes, flops=0, wall_us=None, host_us=None, peak=None, **extra):
    c = {"kind": kind, "median": ms, "GBps": nbytes / (ms * 1e-3) / 1e9}
    c["TFLOPs"] = flops / (ms * 1e-3) / 1e12 if flops else None
    c["bottleneck"] = "compute" if flops and flops / nbytes > 300 else "memory"
    if wall_us is not None:
        c.update(wall_us=wall_us, host_us=host_us, host_bound=host_us > 1e3 * ms)
    if peak is not None:
        c["peak_mem_bytes"] = peak
    c.update(extra)
    return c


def _cmp(speedup, verdict="faster", flag=None, width=0.02):
    return {
        "speedup": speedup,
        "ci_low": speedup * (1 - width),
        "ci_high": speedup * (1 + width),
        "p_value": 0.001,
        "verdict": verdict,
        "flag": flag,
        "n_ours": 50,
        "n_baseline": 50,
    }


def _record(
    op,
    family,
    shape,
    mode,
    ours,
    baselines,
    *,
    dtype="bfloat16",
    flops=0,
    params=None,
    comparisons=None,
    variants=None,
    correct=None,
    nbytes=2**27,
):
    """A bench record: ``ours`` and ``baselines`` are candidates (a baseline given as a string
    is skipped, with that reason); speedups and wall speedups follow from their times."""
    cands = {"tritonkit": ours, **(variants or {})}
    speedup, walls = {}, {}
    for name, b in baselines.items():
        if isinstance(b, str):
            cands[name] = {"kind": "baseline", "skipped": b}
            continue
        cands[name] = b
        speedup[name] = b["median"] / ours["median"]
        if b.get("wall_us") and ours.get("wall_us"):
            walls[name] = b["wall_us"] / ours["wall_us"]
    comparison = {n: _cmp(v) for n, v in speedup.items()}
    comparison.update(comparisons or {})
    record = {
        "op": op,
        "family": family,
        "params": params or {},
        "shape": shape,
        "dtype": dtype,
        "mode": mode,
        "bytes": nbytes,
        "flops": flops,
        "candidates": cands,
        "speedup": {n: comparison[n]["speedup"] for n in speedup},
        "comparison": comparison,
        "note": None,
        "correct": correct or {"passed": True, "rel_l2": 0.0021, "torch_rel_l2": 0.0021},
        "roofline_peak": "bf16" if flops else "fp32",
    }
    if walls:
        record["wall_speedup"] = walls
    return record


def _check(
    op,
    shape,
    case,
    *,
    dtype="bfloat16",
    passed=True,
    rel=0.002,
    torch_rel=0.003,
    detail="",
    skipped=None,
    params="",
):
    ratio = None if torch_rel is None else (rel / torch_rel if torch_rel else 1.0)
    return {
        "op": op,
        "params": params,
        "shape": shape,
        "dtype": dtype,
        "case": case,
        "passed": passed,
        "max_abs": None if rel is None else 10 * rel,
        "rel_l2": rel,
        "torch_rel_l2": torch_rel,
        "ratio": ratio,
        "sqnr_db": None,
        "err_p50": None,
        "err_p99": None,
        "seed": 7,
        "detail": detail,
        "skipped": skipped,
    }


def synthetic_checks():
    """Checks of every kind the report tells apart: passed, passed on PyTorch's own error,
    failed, skipped, exact (error 0), without a measurable PyTorch error, empty tensors."""
    excused = "output 0: passed: largest error 0.0625, within 2 x PyTorch's own largest error 0.04"
    return [
        _check("rms_norm", "(5, 129)", "random"),
        _check("rms_norm", "(5, 129)", "mixed", rel=0.0024),
        _check("rms_norm", "(5, 129)", "grad", rel=0.004, torch_rel=0.0031, detail=excused),
        _check("rms_norm", "(0, 129)", "empty", rel=None, torch_rel=None),
        _check("relu", "(3, 129)", "random", rel=0.0, torch_rel=0.0),
        _check("relu", "(3, 129)", "specials", rel=0.0, torch_rel=0.0),
        _check(
            "matmul",
            "(17, 33, 65)",
            "random",
            dtype="float32",
            passed=False,
            rel=0.02,
            torch_rel=1e-6,
            detail="output 0: |out - ref| = 0.5 > 0.01 at index [3, 4]\ntrace",
        ),
        _check("matmul", "(17, 33, 65)", "grad", dtype="float32", rel=2e-6, torch_rel=1.5e-6),
        _check("quantize", "(3, 5, 40)", "random", params="granularity='row'", torch_rel=None),
        _check(
            "scaled_matmul",
            "all",
            "all",
            dtype="float8_e4m3fn",
            passed=False,
            rel=None,
            torch_rel=None,
            detail="skipped: the interpreter has no fp8",
            skipped="no fp8 here",
        ),
    ]


def synthetic_gpu_document():
    """A GPU results document that covers every column and case of the report, the README
    tables and the regression gate: GPU-time speedups with bootstrap intervals (faster, slower,
    no significant difference, flagged, infinite), wall-time speedups and host-bound calls,
    baselines skipped (with their reason) or absent, a record that failed its correctness
    check, a case the spec leaves out (a note), an operator without a backward pass, variants
    side by side, a compute-bound GEMM on the roofline, a baseline whose name has a space, and
    checks of every kind (``synthetic_checks``)."""
    mib = 2**20
    norm = [
        _record(
            "rms_norm",
            "norm",
            "(16384, 4096)",
            "fwd",
            _candidate(
                "tritonkit",
                0.0907,
                2**27,
                wall_us=96.6,
                host_us=25.5,
                peak=128 * mib,
                pct_of_roofline=97.6,
                bottleneck="memory",
            ),
            {
                "torch": _candidate(
                    "baseline", 0.1177, 2**27, wall_us=131.4, host_us=14.0, peak=256 * mib
                ),
                "torch.compile": _candidate("baseline", 0.1018, 2**27, wall_us=106.2, host_us=30.0),
                "liger": _candidate("baseline", 0.0872, 2**27, wall_us=91.5, host_us=40.1),
            },
            comparisons={"liger": _cmp(0.0872 / 0.0907, "slower")},
        ),
        _record(
            "rms_norm",
            "norm",
            "(16384, 4096)",
            "fwd+bwd",
            _candidate(
                "tritonkit",
                0.301,
                2**28,
                wall_us=310.0,
                host_us=80.0,
                peak=384 * mib,
                pct_of_roofline=71.2,
                bottleneck="memory",
            ),
            {
                "torch": _candidate(
                    "baseline", 0.452, 2**28, wall_us=470.0, host_us=60.0, peak=640 * mib
                ),
                "torch.compile": _candidate("baseline", 0.305, 2**28, wall_us=320.0, host_us=95.0),
                "liger": "liger-kernel is not installed",
            },
            comparisons={"torch.compile": _cmp(0.305 / 0.301, "no significant difference")},
        ),
        _record(
            "rms_norm",
            "norm",
            "(64, 3000)",
            "fwd",
            _candidate(
                "tritonkit",
                0.0042,
                2**19,
                wall_us=38.0,
                host_us=36.5,
                pct_of_roofline=3.1,
                bottleneck="memory",
            ),
            {"torch": _candidate("baseline", 0.0061, 2**19, wall_us=9.9, host_us=9.1)},
        ),
    ]
    elementwise = [
        _record(
            "relu",
            "elementwise",
            "(16384, 8192)",
            "fwd",
            _candidate(
                "tritonkit",
                0.0871,
                2**28,
                wall_us=90.0,
                host_us=12.0,
                pct_of_roofline=101.0,
                bottleneck="memory",
            ),
            {
                "torch": _candidate("baseline", 0.0870, 2**28, wall_us=89.7, host_us=9.0),
                "cuda": _candidate("baseline", 3.31, 2**28),
            },
            comparisons={
                "torch": _cmp(0.0870 / 0.0871, "no significant difference"),
                "cuda": _cmp(
                    3.31 / 0.0871,
                    flag="speedup 38.0x is above 10x: check the baseline is doing the same work",
                ),
            },
        ),
        _record(
            "relu",
            "elementwise",
            "(16384, 8192)",
            "fwd+bwd",
            _candidate("tritonkit", 0.265, 2**29, pct_of_roofline=99.0, bottleneck="memory"),
            {"torch": _candidate("baseline", 0.318, 2**29), "cuda": "no backward pass"},
            correct={
                "passed": False,
                "rel_l2": 0.031,
                "torch_rel_l2": 0.002,
                "detail": "output 0: |out - ref| = 0.2 > 0.01",
            },
        ),
    ]
    infinite = elementwise[1]
    infinite["speedup"]["torch"] = float("inf")
    infinite["comparison"]["torch"].update(speedup=float("inf"), ci_high=float("inf"))
    add_bwd = _record(
        "add",
        "elementwise",
        "((16384, 8192), (16384, 8192))",
        "fwd+bwd",
        _candidate("tritonkit", 1.0, 2**29),
        {},
    )
    add_bwd.update(candidates={}, speedup={}, comparison={}, correct={})
    add_bwd["note"] = "the gradient passes through to both inputs: no kernel runs (as in PyTorch)"
    elementwise.append(add_bwd)
    gemm_flops = 2 * 4096**3
    matmul = _record(
        "matmul",
        "matmul",
        "(4096, 4096, 4096)",
        "fwd",
        _candidate(
            "tritonkit",
            0.221,
            3 * 2 * 4096**2,
            gemm_flops,
            wall_us=230.0,
            host_us=20.0,
            pct_of_roofline=88.0,
            bottleneck="compute",
        ),
        {
            "torch": _candidate(
                "baseline", 0.215, 3 * 2 * 4096**2, gemm_flops, wall_us=224.0, host_us=11.0
            )
        },
        dtype="float16",
        flops=gemm_flops,
        nbytes=3 * 2 * 4096**2,
        variants={
            "v1 naive": _candidate("variant", 1.90, 3 * 2 * 4096**2, gemm_flops),
            "v2 tiled": _candidate("variant", 0.402, 3 * 2 * 4096**2, gemm_flops),
            "v3 unmeasured": {"kind": "variant", "skipped": "out of shared memory"},
        },
        comparisons={"torch": _cmp(0.215 / 0.221, "slower")},
    )
    quant = [
        _record(
            "int8_weight_only_linear",
            "quant",
            "(1, 8192, 8192)",
            "fwd",
            _candidate(
                "tritonkit",
                0.0441,
                2**26 + 2**14,
                2 * 8192**2,
                wall_us=61.0,
                host_us=58.0,
                pct_of_roofline=80.2,
                bottleneck="memory",
            ),
            {
                "torch": _candidate(
                    "baseline", 0.0890, 2**27, 2 * 8192**2, wall_us=95.0, host_us=15.0
                ),
                "bf16 linear": _candidate(
                    "baseline", 0.0523, 2**27, 2 * 8192**2, wall_us=20.0, host_us=9.0
                ),
            },
            flops=2 * 8192**2,
        ),
        _record(
            "quantize",
            "quant",
            "(16384, 8192)",
            "fwd",
            _candidate(
                "tritonkit", 0.140, 2**28 + 2**27, pct_of_roofline=80.0, bottleneck="memory"
            ),
            {
                "torch": _candidate("baseline", 0.620, 2**28 + 2**27),
                "torch.compile": "Unavailable: torch.compile has no float8 here",
            },
            params={"granularity": "row"},
        ),
    ]
    no_backward = _record(
        "quantize",
        "quant",
        "(16384, 8192)",
        "fwd+bwd",
        _candidate("tritonkit", 1.0, 1),
        {},
        params={"granularity": "row"},
    )
    no_backward.update(
        candidates={}, speedup={}, comparison={}, correct={}, note="no backward pass"
    )
    quant.append(no_backward)
    doc = synthetic_results([*norm, *elementwise, matmul, *quant])
    doc["checks"] = synthetic_checks()
    doc["ops"] = ["rms_norm", "relu", "add", "matmul", "int8_weight_only_linear", "quantize"]
    return doc


def synthetic_interpreter_document():
    """What the main job writes without a GPU: checks only (``synthetic_checks``)."""
    doc = synthetic_results([])
    doc["kind"], doc["ceilings"], doc["bench"] = "interpreter", None, []
    fp = dict(doc["fingerprint"])
    for key in ("gpu_capability", "gpu_sms", "gpu_memory_GiB", "driver", "cuda"):
        fp.pop(key)
    fp["gpu"] = None
    doc["fingerprint"] = fp
    doc["checks"] = synthetic_checks()
    doc["ops"] = list(dict.fromkeys(c["op"] for c in doc["checks"]))
    return doc


def synthetic_regression(doc):
    """``doc`` after a change: one case slower, one less accurate, one check newly failed, one
    faster; the others the same."""
    import copy

    new = copy.deepcopy(doc)
    timed = [r for r in new["bench"] if "median" in r["candidates"].get("tritonkit", {})]
    timed[0]["candidates"]["tritonkit"]["median"] *= 1.25  # slower
    timed[1]["correct"]["rel_l2"] *= 3  # less accurate
    timed[2]["correct"]["passed"] = False  # a check that passed now fails
    timed[3]["candidates"]["tritonkit"]["median"] *= 0.5  # faster
    new["fingerprint"]["git_commit"] = "def"
    return new
