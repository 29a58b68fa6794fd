"""The OpSpec kinds beyond pure floating-point operators: in-place (``mutates``), integer and
index tensors with Exact and SQNR metrics, and several ranks (``distributed``). Each kind is
shown passing on a real kernel (tests/_workbench_specs.py) and failing where it must."""

import dataclasses
import math

import pytest
import torch

from tritonkit.harness.check import check_spec, compare, fresh_seed, sqnr_db
from tritonkit.harness.spec import SQNR, Exact, Tolerance
from tritonkit.specs._common import read_write_bytes

import _workbench_specs as demo
from _checks import DEVICE


def _failures(spec, device=DEVICE, **kwargs):
    results = check_spec(spec, device=device, seed=fresh_seed(), **kwargs)
    assert results, f"{spec.name}: no checks ran"
    return [r for r in results if not r.passed and not r.skipped]


@pytest.mark.parametrize("spec", [demo.AXPY, demo.GATHER_SCALE, demo.QUANT_ROWS])
def test_demo_specs_pass(spec):
    failed = _failures(spec)
    assert not failed, "\n".join(f"{r.shape} {r.case}: {r.detail}" for r in failed[:5])


# ---- in place ----------------------------------------------------------------------------------


def test_mutated_inputs_are_compared_and_copied_per_run():
    """An in-place op that writes nothing or a wrong value fails; the caller's inputs are never
    changed (every run gets copies of its own)."""
    x = torch.randn(9, device=DEVICE)
    y = torch.randn(9, device=DEVICE)
    before = y.clone()
    lazy = dataclasses.replace(demo.AXPY, impl=lambda y, x, alpha=0.5: None)
    assert _failures(lazy, cases=("random",))
    off = dataclasses.replace(
        demo.AXPY, impl=lambda y, x, alpha=0.5: demo.axpy_(y, x, alpha + 0.01)
    )
    failed = _failures(off, cases=("random",))
    assert failed and all("output 0" in r.detail for r in failed)
    demo.AXPY.impl(y, x)
    assert not torch.equal(y, before)  # the op itself does write in place
    from tritonkit.harness.check import run_forward

    y2, x2 = before.clone(), x.clone()
    assert run_forward(demo.AXPY, (y2, x2), {}, Tolerance(1e-6, 1e-5)).passed
    assert torch.equal(y2, before) and torch.equal(x2, x)


def test_an_undeclared_write_fails():
    """An operator that writes an input its spec does not list in ``mutates`` fails."""
    sneaky = dataclasses.replace(demo.AXPY, mutates=(), backward=False)
    failed = _failures(dataclasses.replace(sneaky, reference=lambda y, x, alpha=0.5: None))
    assert failed and "input 0 was written" in failed[0].detail


def test_mutating_specs_have_no_backward():
    with pytest.raises(ValueError, match="mutates its inputs has no backward"):
        dataclasses.replace(demo.AXPY, backward=True)


def test_read_write_bytes_counts_mutated_inputs_twice():
    y, x = torch.empty(10, device=DEVICE), torch.empty(10, dtype=torch.float16, device=DEVICE)
    assert read_write_bytes((y, x, 0.5), (0,)) == 40 + 20 + 40


# ---- integers, index arrays, SQNR ---------------------------------------------------------------


def test_exact_metric_names_the_first_difference():
    ref = torch.arange(10, dtype=torch.float64, device=DEVICE)
    ours = torch.arange(10, dtype=torch.int32, device=DEVICE)
    assert compare(ours, ref, ours, None).passed  # integer outputs: Exact by default
    ours[7] = 8
    o = compare(ours, ref, ours, None)
    assert not o.passed and "1 of 10 elements" in o.detail and "index [7]" in o.detail
    # a floating output judged Exact: NaN matches NaN, one rounding step does not
    f = torch.tensor([1.0, float("nan")], dtype=torch.float16, device=DEVICE)
    r = torch.tensor([1.0, float("nan")], dtype=torch.float64, device=DEVICE)
    assert compare(f, r, f, None, {0: Exact()}).passed
    f2 = torch.tensor([1.0 + 2**-10, float("nan")], dtype=torch.float16, device=DEVICE)
    assert not compare(f2, r, f2, None, {0: Exact()}).passed


def test_an_off_by_one_integer_kernel_fails():
    wrong = dataclasses.replace(
        demo.GATHER_SCALE, impl=lambda x, idx: demo.gather_scale(x, idx) + (idx == idx.max())
    )
    failed = _failures(wrong, cases=("random",))
    assert failed and "differ from the exact result" in failed[0].detail


def test_floating_output_without_a_tolerance_says_so():
    ours = torch.ones(4, device=DEVICE)
    o = compare(ours, ours.double(), ours, None)
    assert not o.passed and "no tolerance" in o.detail


def test_sqnr_and_percentiles():
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    ref = torch.randn(4096, generator=gen, dtype=torch.float64, device=DEVICE)
    noise = torch.randn(4096, generator=gen, dtype=torch.float64, device=DEVICE)
    ours = (ref + 0.01 * noise).float()
    expected = 10 * math.log10(ref.square().sum() / (0.01 * noise).square().sum())
    assert sqnr_db(ours, ref) == pytest.approx(expected, abs=0.01)
    assert sqnr_db(ref, ref) == math.inf
    o = compare(ours, ref, ours, None, {0: SQNR(min_db=35.0)})
    assert o.passed and o.sqnr_db == pytest.approx(40.0, abs=0.5)
    assert 0 < o.err_p50 < o.err_p99 <= o.max_abs
    o = compare(ours, ref, ours, None, {0: SQNR(min_db=45.0)})
    assert not o.passed and "SQNR" in o.detail and "< 45 dB" in o.detail
    o = compare(ours, ref, ours, None, {0: SQNR(min_db=35.0, p99=o.err_p50)})
    assert not o.passed and "99th percentile" in o.detail
    by_dtype = SQNR(min_db={torch.float32: 35.0})
    assert compare(ours, ref, ours, None, {0: by_dtype}).passed
    with pytest.raises(KeyError, match="no min_db"):
        compare(ours.half(), ref, ours.half(), None, {0: by_dtype})
    nan = ours.clone()
    nan[5] = float("nan")
    o = compare(nan, ref, nan, None, {0: SQNR(min_db=0.0)})
    assert not o.passed and "NaN at index [5]" in o.detail


def test_a_coarser_quantizer_fails_its_sqnr():
    """Quantizing to 7 levels instead of 255 loses about 25 dB: the spec's minimum catches it."""

    def coarse(x):
        q, scale = demo.quantize_rows_int8(x)
        return (torch.round(q.float() / 32) * 32).clamp(-127, 127).to(torch.int8), scale

    failed = _failures(dataclasses.replace(demo.QUANT_ROWS, impl=coarse), cases=("random",))
    assert failed and all("SQNR" in r.detail or "max |out - ref|" in r.detail for r in failed)


def test_sqnr_results_carry_percentiles():
    results = check_spec(demo.QUANT_ROWS, device=DEVICE, seed=1, cases=("random",))
    assert results and all(r.passed for r in results)
    assert all(r.sqnr_db > 35 and 0 < r.err_p50 <= r.err_p99 <= 0.5001 for r in results)


# ---- several ranks -----------------------------------------------------------------------------


@pytest.mark.slow
def test_all_reduce_on_two_ranks(monkeypatch):
    """The spec runs on two spawned ranks: it passes, and a kernel that returns its own rank's
    input instead of the sum fails on both ranks. With two GPUs the ranks run on them (nccl);
    otherwise on the CPU (gloo) under the interpreter, which the spawned ranks inherit from
    this process's environment (set here for a machine with one GPU)."""
    if torch.cuda.device_count() >= 2:
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")  # host: gloo ranks, under the interpreter
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    failed = _failures(demo.ALL_REDUCE, device, cases=("random", "slice", "specials"))
    assert not failed, "\n".join(f"{r.shape} {r.case}: {r.detail}" for r in failed[:5])
    failed = _failures(demo.ALL_REDUCE_WRONG, device, cases=("random",))
    assert failed and all("rank 0:" in r.detail and "rank 1:" in r.detail for r in failed)


def test_distributed_check_without_enough_gpus_is_skipped():
    if torch.cuda.device_count() >= 2:
        pytest.skip("two GPUs here: the nccl run is the GPU script's")
    results = check_spec(demo.ALL_REDUCE, device="cuda", seed=0)
    found = torch.cuda.device_count()
    assert len(results) == 1 and results[0].skipped == f"needs 2 GPUs (one per rank), found {found}"
