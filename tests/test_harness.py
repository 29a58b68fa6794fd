"""The workbench itself: the check engine must catch wrong kernels; stats, registry, reports."""

import json
import math

import pytest
import torch

from tritonkit.harness import report, spec
from tritonkit.harness.check import (
    check_spec,
    inject_specials,
    poisoned_allocations,
    relayout,
)
from tritonkit.harness.spec import OpSpec, Shapes
from tritonkit.harness.timing import summarize

from _synthetic import synthetic_results


def _toy_spec(impl, reference=torch.sin, **kw):
    def make_inputs(shape, dtype, device, seed):
        g = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(shape, generator=g, device=device).to(dtype),)

    defaults = dict(
        name="toy",
        family="toy",
        impl=impl,
        reference=reference,
        make_inputs=make_inputs,
        shapes=Shapes(test=[(5, 17)], bench=[], empty=[(0, 3)]),
        bytes=lambda inputs, mode, **params: 0,
        dtypes=(torch.float32,),
    )
    defaults.update(kw)
    return OpSpec(**defaults)


def _failures(s, **kw):
    return {r.case for r in check_spec(s, seed=0, **kw) if not r.passed}


def _sin_writing_all_but_last(x):
    out = torch.empty_like(x)
    flat_out, flat_x = out.view(-1), x.reshape(-1)
    flat_out[:-1] = torch.sin(flat_x[:-1])
    return out


def test_correct_operator_passes_every_case():
    assert _failures(_toy_spec(torch.sin)) == set()


def test_unwritten_output_element_is_caught_by_poisoning():
    # With a plain allocator the last element could hold anything, even the right value;
    # poisoned allocations make it NaN. (The specials case puts -inf there, whose sine is NaN.)
    failed = _failures(_toy_spec(_sin_writing_all_but_last, backward=False))
    assert {"random", "slice", "transpose", "stride2", "mixed"} <= failed


def test_small_error_beyond_tolerance_is_caught():
    assert "random" in _failures(_toy_spec(lambda x: torch.sin(x) * (1 + 1e-4)))


def test_nan_swallowed_is_caught():
    assert _failures(_toy_spec(lambda x: torch.sin(torch.nan_to_num(x)))) == {"specials"}


def _sin_with_gradient_scale(scale):
    """sin(x) whose backward multiplies the true gradient by ``scale(x)``."""

    class ScaledGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.sin(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.cos(x) * scale(x)

    return ScaledGrad.apply


def test_wrong_gradient_is_caught():
    bad = _sin_with_gradient_scale(lambda x: 1.01)
    assert _failures(_toy_spec(bad)) == {"grad", "grad-transpose"}


def test_layout_dependent_gradient_is_caught():
    """A backward that is wrong only for a transposed input (as LayerNorm's once was, when its
    forward and backward took different paths there): only the grad-transpose case sees it."""
    bad = _sin_with_gradient_scale(lambda x: 1.0 if x.is_contiguous() else 1.01)
    assert _failures(_toy_spec(bad)) == {"grad-transpose"}


def test_wrong_shape_or_crash_is_a_failure_not_an_exception():
    res = check_spec(_toy_spec(lambda x: torch.sin(x).t()), seed=0, cases=("random",))
    assert not res[0].passed and "shape" in res[0].detail
    res = check_spec(_toy_spec(lambda x: 1 / 0), seed=0, cases=("random",))
    assert not res[0].passed and "ZeroDivisionError" in res[0].detail


def test_layout_dependent_bug_is_caught():
    # An operator that ignores strides and reads the underlying storage in order.
    def storage_order_sin(x):
        flat = torch.as_strided(x, (x.numel(),), (1,))
        return torch.sin(flat).view(x.shape)

    failed = _failures(_toy_spec(storage_order_sin, backward=False))
    assert {"slice", "transpose", "stride2"} <= failed
    assert "random" not in failed


def test_poisoned_allocations_restore_torch():
    original = torch.empty
    with poisoned_allocations():
        assert torch.isnan(torch.empty(4)).all()
        assert torch.isnan(torch.empty_like(torch.zeros(3))).all()
        assert (torch.empty(2, dtype=torch.int32) == -7777).all()
    assert torch.empty is original


@pytest.mark.parametrize("kind", ["slice", "transpose", "stride2"])
def test_relayout_keeps_values_changes_strides(kind):
    x = torch.randn(3, 4, 5)
    y = relayout(x, kind)
    assert torch.equal(x, y)
    assert y.stride() != x.stride()


def test_inject_specials_leaves_the_input_alone():
    x = torch.randn(10)
    (y,) = inject_specials((x,))
    assert torch.isfinite(x).all()
    assert torch.isnan(y[0]) and y[5] == math.inf and y[9] == -math.inf


def test_summarize_known_samples():
    s = summarize(list(range(1, 101)))
    assert s.n == 100 and s.median == pytest.approx(50.5)
    assert s.p10 == pytest.approx(10.9) and s.p90 == pytest.approx(90.1)
    assert s.spread == pytest.approx((90.1 - 10.9) / 50.5)
    with pytest.raises(ValueError):
        summarize([])


def test_unknown_op_lists_known_ones():
    with pytest.raises(
        spec.UnknownOp, match=r"unknown operator 'gelux'.*; known operators: .*gelu"
    ):
        spec.get_spec("gelux")


def test_select_by_family_and_name():
    names = [s.name for s in spec.select(["memory", "relu"])]
    assert names == ["copy", "transpose", "relu"]


def test_every_spec_is_complete():
    for s in spec.all_specs():
        assert s.shapes.test and s.shapes.bench, s.name
        if s.distributed is None:
            assert {"torch", "torch.compile"} <= set(s.baselines), s.name
        else:  # a collective is timed against torch.distributed's own (NCCL, or gloo)
            assert "nccl" in s.baselines, s.name
        x = s.make_inputs(s.shapes.test[0], torch.float32, torch.device("cpu"), 0)
        assert s.bytes(x, "fwd", **s.params[0]) > 0, s.name


def test_parse_dtype():
    assert spec.parse_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        spec.parse_dtype("fp8")


# ---- reports -----------------------------------------------------------------------------------


def test_report_round_trip_and_tables(tmp_path):
    results = synthetic_results()
    paths = report.write_report(results, tmp_path)
    assert report.load_json(tmp_path / "results.json") == json.loads(json.dumps(results))
    md = (tmp_path / "report.md").read_text()
    assert "Test GPU" in md and "2.00x [1.96, 2.04]" in md and "5,369 GB/s" in md
    assert any(p.suffix == ".png" for p in paths) or not _has_matplotlib()


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_readme_section_is_regenerated(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_BEGIN}\nstale\n{report.README_END}\noutro\n")
    assert report.update_readme(readme, synthetic_results(), "x.json")
    text = readme.read_text()
    assert "stale" not in text and "2.00x torch" in text and text.endswith("outro\n")
    assert not report.update_readme(readme, synthetic_results(), "x.json")
    # the README's summary: one line per operator
    readme.write_text(f"{report.README_SUMMARY_BEGIN}\nstale\n{report.README_SUMMARY_END}\n")
    assert report.update_readme(readme, synthetic_results(), "x.json")
    assert "stale" not in readme.read_text() and "| operator | shape |" in readme.read_text()
    readme.write_text("no section")
    with pytest.raises(ValueError, match="no generated section"):
        report.update_readme(readme, synthetic_results(), "x.json")


def test_load_json_rejects_other_documents(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{}")
    with pytest.raises(ValueError, match="not a tritonkit results document"):
        report.load_json(p)
    with pytest.raises(ValueError, match="does not exist"):
        report.load_json(tmp_path / "missing.json")


def test_merge_joins_runs_of_one_gpu_and_refuses_two():
    from _synthetic import synthetic_record

    a = synthetic_results([synthetic_record(op="relu")])
    b = synthetic_results([synthetic_record(op="gelu")])
    merged = report.merge([a, b])
    assert [r["op"] for r in merged["bench"]] == ["relu", "gelu"]
    with pytest.raises(ValueError, match="different GPUs"):
        report.merge([a, synthetic_results(gpu="Other GPU")])


def test_merge_replaces_a_re_timed_case_and_keeps_the_history():
    from _synthetic import synthetic_record

    def run(records, ops, commit, checks=()):
        doc = synthetic_results(records)
        doc["ops"], doc["checks"] = ops, [{"op": op, "passed": True} for op in checks]
        doc["fingerprint"] = {**doc["fingerprint"], "git_commit": commit}
        return doc

    gelu_bwd = {**synthetic_record(op="gelu"), "mode": "bwd"}
    old = report.merge(
        [
            run(
                [synthetic_record(op="relu"), synthetic_record(op="gelu")], ["relu"], "a", ["relu"]
            ),
            run([gelu_bwd], ["gelu"], "b", ["gelu", "gelu"]),
        ]
    )
    new_gelu = synthetic_record(op="gelu")
    new_gelu["note"] = "re-timed"
    merged = report.merge([old, run([new_gelu], ["gelu"], "c", ["gelu"])])
    # the re-timed case replaces its record in place; the other cases stay
    assert [(r["op"], r["mode"]) for r in merged["bench"]] == [
        ("relu", "fwd"),
        ("gelu", "fwd"),
        ("gelu", "bwd"),
    ]
    assert merged["bench"][1]["note"] == "re-timed"
    # gelu's checks are the latest run's; relu's stay
    assert [c["op"] for c in merged["checks"]] == ["relu", "gelu"]
    assert merged["ops"] == ["relu", "gelu"]
    assert [m["git_commit"] for m in merged["merged_from"]] == ["a", "b", "c"]


def test_operator_name_wins_over_a_family_of_the_same_name():
    assert [s.name for s in spec.select(["matmul"])] == ["matmul"]
    assert {s.name for s in spec.select(["norm"])} >= {"layer_norm", "rms_norm"}


def test_readme_table_is_generated_from_the_committed_results():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    source = "benchmarks/results/nvidia-h100.json"
    results = report.load_json(root / source)
    summary = report.render_summary_table(results, source).strip()
    begin, end = report.README_SUMMARY_BEGIN, report.README_SUMMARY_END
    assert report.readme_section(root / "README.md", begin, end) == summary
    # every (operator, shape, dtype) and the host times: docs/results.md
    assert report.readme_section(root / "docs/results.md") == (
        report.render_readme_table(results, source).strip()
    )
    host = report.readme_section(
        root / "docs/results.md", report.README_HOST_BEGIN, report.README_HOST_END
    )
    assert host == report.render_host_table(results, source).strip()


def test_interpreter_skip_is_reported_never_passed(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    s = _toy_spec(torch.sin, interpreter_skip={torch.float32: "a known interpreter bug"})
    results = check_spec(s, seed=0)
    assert len(results) == 1
    assert results[0].skipped == "a known interpreter bug" and not results[0].passed


def test_max_ratio_bounds_the_relative_error_against_pytorchs():
    """A tolerance with max_ratio also fails an output whose relative L2 error exceeds that
    multiple of PyTorch's own, even when every element is within atol + rtol."""
    from tritonkit.harness.check import compare
    from tritonkit.harness.spec import Tolerance

    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(256, generator=gen, dtype=torch.float64)
    noise = torch.randn(256, generator=gen, dtype=torch.float64)
    same = (ref + 1e-3 * noise).float()
    ours = (ref + 2e-3 * noise).float()  # twice PyTorch's error, well within atol
    loose = Tolerance(atol=1e-1, rtol=0.0)
    assert compare(ours, ref, same, loose).passed
    o = compare(ours, ref, same, Tolerance(1e-1, 0.0, 1.5))
    assert not o.passed and o.rel_l2 / o.torch_rel_l2 == pytest.approx(2.0, rel=1e-3)
    assert "relative L2 error" in o.detail and "1.5 x PyTorch's" in o.detail
    assert compare(ours, ref, same, Tolerance(1e-1, 0.0, 2.5)).passed


def test_max_ratio_is_not_held_against_float32_errors_at_rounding_level():
    """Two float32 errors both at float32's rounding (under check.RATIO_FLOOR): their ratio
    measures summation orders and is not checked; just above the floor it is."""
    from tritonkit.harness.check import RATIO_FLOOR, compare
    from tritonkit.harness.spec import Tolerance

    gen = torch.Generator().manual_seed(4)
    ref = torch.randn(4096, generator=gen, dtype=torch.float64)
    noise = torch.randn(4096, generator=gen, dtype=torch.float64)
    floor = RATIO_FLOOR[torch.float32]
    tol = Tolerance(atol=1e-3, rtol=0.0, max_ratio=2.0)
    same = ref + 0.1 * floor * noise  # what the float32 rounding of ref adds, and a bit more
    for scale, passes in ((0.5, True), (3.0, False)):  # ours: 5x and 30x PyTorch's error
        ours = (ref + scale * floor * noise).float()
        o = compare(ours, ref, same.float(), tol)
        assert o.passed == passes, (scale, o.rel_l2, o.torch_rel_l2, o.detail)


def test_torch_factor_excuses_no_more_than_pytorchs_own_error():
    """An output that misses atol + rtol passes under torch_factor only while its largest error
    is within that multiple of PyTorch's largest same-dtype error; a NaN is never excused."""
    from tritonkit.harness.check import compare
    from tritonkit.harness.spec import Tolerance

    ref = torch.linspace(-1.0, 1.0, 64, dtype=torch.float64)
    same = (ref + 0.3).float()  # PyTorch off by 0.3 everywhere
    tight = Tolerance(atol=1e-2, rtol=0.0)
    for err, factor, expected in [(0.2, None, False), (0.2, 1.0, True), (0.5, 1.0, False)]:
        ours = (ref - err).float()
        tol = Tolerance(tight.atol, tight.rtol, torch_factor=factor)
        o = compare(ours, ref, same, tol)
        passed, max_abs, detail = o.passed, o.max_abs, o.detail
        assert passed == expected, (err, factor, detail)
        assert max_abs == pytest.approx(err, rel=1e-5) or not passed
        # a pass on torch_factor's count says so; a pass within the bound says nothing
        assert ("within 1 x PyTorch's own largest error 0.3" in detail) == (passed and bool(factor))
        # ... as a pass, not as the failure of the elementwise bound it was excused from
        assert not passed or not detail or detail.startswith("output 0: passed")
        assert not passed or "atol" not in detail
    ours = (ref - 0.2).float()
    ours[3] = float("nan")
    assert not compare(ours, ref, same, Tolerance(1e-2, 0.0, torch_factor=10.0)).passed


def test_report_lists_checks_passed_on_pytorchs_error():
    """render_checks names each check that passed only on torch_factor's count."""
    from tritonkit.harness.report import render_checks

    base = dict(op="toy", params="", shape="(1, 5)", dtype="bfloat16", rel_l2=0.1, ratio=0.6)
    checks = [
        dict(base, case="random", passed=True, detail=""),
        dict(base, case="grad", passed=True, detail="output 0: |out - ref| = 0.07, but within"),
    ]
    out = render_checks(checks)
    assert "2/2" in out and "Passed on PyTorch's own error. The rule:" in out
    assert "`worst ratio to PyTorch's error`, the largest" in out  # the columns explained
    assert "toy (1, 5) bfloat16 grad: output 0:" in out and "random:" not in out


def test_planned_cases_is_what_check_spec_returns():
    """The progress total is the number of results: no case the run leaves out (the replay
    case off the GPU) is counted, or the counter stops short of it."""
    from tritonkit.harness.check import planned_cases

    for kw in ({}, {"backward": False}, {"special_values": False}):
        s = _toy_spec(torch.sin, **kw)
        assert planned_cases(s) == len(check_spec(s, seed=0)), kw


@pytest.mark.parametrize("name", ["spmv", "bsr_mm"])
def test_bench_shape_check_takes_the_case_dtype(name, device):
    """bench checks each case at its own shape before timing it (and skips the timing when the
    check fails): under the case dtype's tolerance, not the first input's (a sparse operator's
    first input is its int32 indices, which have none: every sparse case went untimed)."""
    import tritonkit.specs  # noqa: F401
    from tritonkit.harness.bench_cases import _bench_correctness

    s = spec.get_spec(name)
    dtype = s.bench_dtypes[0]
    inputs = s.make_inputs(s.shapes.test[0], dtype, device, 0)
    assert s.tolerance_or_none(inputs[0].dtype) is None  # the indices
    assert _bench_correctness(s, inputs, dict(s.params[0]), dtype)["passed"]
