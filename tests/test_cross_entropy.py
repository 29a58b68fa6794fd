"""Cross-entropy: accuracy through the check engine, PyTorch's corner cases, memory, compile;
class-index and class-probability targets, (N, C) and K-dimensional (N, C, d1, ...) logits."""

import dataclasses
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tritonkit.harness.check import check_spec, fresh_seed, poisoned_allocations
from tritonkit.harness.spec import get_spec
from tritonkit.nn.loss import CrossEntropyLoss
from tritonkit.ops.cross_entropy import CROSS_ENTROPY, cross_entropy, cross_entropy_loss
from tritonkit.ops.cross_entropy.config import align_for, ce_config, row_strides
from tritonkit.ops.cross_entropy.kernels_forward import ce_stats_kernel

from _checks import assert_spec_passes, compile_backend

pytestmark = pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")


@pytest.mark.slow
def test_check_engine_passes(device):
    """Every shape x dtype x variant: random, non-contiguous, NaN/inf, gradients, empty."""
    assert_spec_passes("cross_entropy", device)


def ce(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
       config=None):  # fmt: skip
    """cross_entropy with a config (None: the default)."""
    return cross_entropy_loss(x, target, weight, ignore_index, reduction, label_smoothing, config)


def assert_passes_with(config, device, **kwargs):
    """The check engine on the cross_entropy spec, its operator run under ``config``."""

    def impl(logits, target, weight, weighted=False, ignore_index=-100, **options):
        if ignore_index != -100:  # as the spec's variant: the ignored rows onto that class
            target = torch.where(target == -100, ignore_index, target)
        return ce(logits, target, weight if weighted else None, ignore_index, **options,
                  config=config)  # fmt: skip

    spec = dataclasses.replace(get_spec("cross_entropy"), impl=impl)
    seed = fresh_seed()
    results = check_spec(spec, device=device, seed=seed, **kwargs)
    failed = [r for r in results if not r.passed and not r.skipped]
    report = "\n".join(f"{r.params} {r.shape} {r.dtype} {r.case}: {r.detail}" for r in failed[:10])
    assert results and not failed, f"base seed {seed}: {len(failed)} failed\n{report}"


@pytest.mark.slow  # segments: test_segment_boundaries in the fast tier
def test_segmented_rows_pass_the_check_engine(device):
    """129 classes in segments of 64 (the last holds one class): partials merged per row."""
    assert_passes_with(
        dataclasses.replace(CROSS_ENTROPY, seg=64),
        device,
        shapes=[(6, 129)],
        dtypes=[torch.float32],
        cases=("random", "transpose", "specials", "grad"),
    )


def _compare(logits, target, weight=None, grad_output=None, config=None, **kwargs):
    """Loss and logits gradient against F.cross_entropy in float64."""
    ours_in = logits.detach().clone().requires_grad_()
    ref_in = logits.detach().double().requires_grad_()
    loss = ce(ours_in, target, weight, **kwargs, config=config)
    ref = F.cross_entropy(ref_in, target, None if weight is None else weight.double(), **kwargs)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6, equal_nan=True)
    g = torch.randn(loss.shape, device=loss.device) if grad_output is None else grad_output
    (ga,) = torch.autograd.grad(loss, ours_in, g)
    (gd,) = torch.autograd.grad(ref, ref_in, g.double())
    torch.testing.assert_close(ga.double(), gd, rtol=1e-5, atol=1e-6)
    return loss, ga


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_targets_ignored(reduction, device):
    """mean is 0 / 0 = NaN, as in PyTorch; the gradient is zero."""
    logits = torch.randn(4, 9, device=device)
    target = torch.full((4,), -100, device=device)
    for weight in (None, torch.rand(9, device=device) + 0.5):
        loss, grad = _compare(logits, target, weight, reduction=reduction, label_smoothing=0.1)
        if reduction == "mean":
            assert torch.isnan(loss)
        assert not grad.any()


@pytest.mark.parametrize("smoothing", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_label_smoothing_and_class_weights(smoothing, reduction, device):
    logits = torch.randn(7, 11, device=device) * 3
    target = torch.randint(0, 11, (7,), device=device)
    target[2] = -100
    for weight in (None, torch.rand(11, device=device) + 0.5):
        _compare(logits, target, weight, reduction=reduction, label_smoothing=smoothing)


def test_ignore_index_as_a_class_and_one_dim_input(device):
    logits = torch.randn(6, 5, device=device)
    target = torch.tensor([0, 2, 2, 4, 1, 2], device=device)
    _compare(logits, target, ignore_index=2)
    _compare(logits[0], target[0], reduction="none")
    _compare(logits[1], target[1], torch.rand(5, device=device) + 0.5)


@pytest.mark.parametrize("shape", [(1, 40), (40, 1)])
def test_one_row_and_one_column(shape, device):
    logits = torch.randn(shape, device=device)
    target = torch.zeros(shape[0], dtype=torch.int64, device=device)
    for reduction in ("mean", "none"):
        _compare(logits, target, reduction=reduction, label_smoothing=0.2)


def test_non_contiguous_logits_targets_and_grad_output(device):
    logits = torch.randn(13, 2 * 10, device=device)[:, ::2]  # class stride 2
    target = torch.randint(0, 10, (26,), device=device)[::2]
    grad_output = torch.randn(26, device=device)[::2]
    _compare(logits.t().contiguous().t(), target, reduction="none", grad_output=grad_output)
    _compare(logits, target, reduction="none", grad_output=grad_output)


def test_loss_backward_with_unit_grad_output(device):
    """loss.backward(): grad_output is 1.0, the gradient from the forward is final as is."""
    logits = torch.randn(5, 8, device=device)
    target = torch.randint(0, 8, (5,), device=device)
    _compare(logits, target, grad_output=torch.tensor(1.0, device=device))


@pytest.mark.parametrize("n", [1, 7, 129])
@pytest.mark.parametrize(
    "c", [2, 1000, pytest.param(32001, marks=pytest.mark.slow)], ids=["c2", "c1000", "c32001"]
)
def test_class_indices_at_odd_shapes(n, c, device):
    """The default config at the class-probability test's shapes: one segment (C = 2, 1000)
    or several with a partial last one (32001, an odd width: the aligned walk)."""
    logits = torch.randn(n, c, device=device) * 2
    target = torch.randint(0, c, (n,), device=device)
    target[n // 2] = -100
    _compare(logits, target, torch.rand(c, device=device) + 0.5, label_smoothing=0.1)
    _compare(logits, target, reduction="none")


@pytest.mark.parametrize("bad", [7, 4, -1, -101])
def test_out_of_range_target_raises(bad, device):
    """A target outside [0, C) that is not ignore_index raises as in PyTorch: on the CPU an
    IndexError naming the target, the range and the value, before any kernel runs; on CUDA the
    row kernel's device-side assert, which kills the CUDA context (so a subprocess runs it)."""
    if device.type == "cuda":
        code = (
            "import torch, tritonkit; x = torch.randn(3, 4, device='cuda'); "
            f"t = torch.tensor([0, {bad}, 1], device='cuda'); "
            "tritonkit.cross_entropy(x, t); torch.cuda.synchronize()"
        )
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert run.returncode != 0 and "device-side assert" in run.stderr, run.stderr[-2000:]
        return
    logits = torch.randn(3, 4, device=device, requires_grad=True)
    target = torch.tensor([0, bad, 1], device=device)
    before = sum(ce_stats_kernel.stats.values())
    for reduction in ("mean", "none"):
        with pytest.raises(
            IndexError, match=rf"target must be in \[0, 4\).*ignore_index \(-100\), got {bad}"
        ):
            cross_entropy(logits, target, reduction=reduction)
    with pytest.raises(IndexError, match=f"got {bad}"):
        cross_entropy(logits[1], target[1])  # one-dim input
    assert sum(ce_stats_kernel.stats.values()) == before  # nothing launched


def test_ignore_index_outside_the_classes_is_honoured(device):
    """ignore_index may lie outside [0, C) (-100 by default, or any other value): its rows are
    skipped, not refused."""
    logits = torch.randn(4, 5, device=device)
    _compare(logits, torch.tensor([0, -100, 4, -100], device=device), reduction="none")
    _compare(logits, torch.tensor([9, 1, 9, 2], device=device), ignore_index=9)
    _compare(logits, torch.tensor([-1, 1, 0, -1], device=device), ignore_index=-1)


# ---- segments: rows cut into seg-class pieces (seg set small, the interpreter is slow) --------

SMALL_SEG = 16


@pytest.fixture
def small_seg():
    """A config cutting rows into segments of SMALL_SEG classes."""
    return dataclasses.replace(CROSS_ENTROPY, seg=SMALL_SEG)


@pytest.mark.parametrize(
    "n_cols",
    [3, 10, 2 * SMALL_SEG, 2 * SMALL_SEG + 5],
    ids=["rows-share-a-tile", "shorter-than-seg", "two-segments", "partial-last-segment"],
)
def test_segment_boundaries(n_cols, small_seg, device):
    logits = torch.randn(5, n_cols, device=device) * 3
    target = torch.randint(0, n_cols, (5,), device=device)
    target[1] = -100
    weight = torch.rand(n_cols, device=device) + 0.5
    _compare(logits, target, reduction="none", config=small_seg)
    _compare(logits, target, weight, reduction="mean", label_smoothing=0.2, config=small_seg)
    _, grad = _compare(
        logits, target, reduction="sum", label_smoothing=0.1, grad_output=None, config=small_seg
    )
    # Without class weights each non-ignored row of the gradient sums to 0.
    sums = grad[target != -100].sum(1)
    torch.testing.assert_close(sums, torch.zeros_like(sums), rtol=0, atol=1e-5)


def test_row_maximum_in_the_last_segment(small_seg, device):
    """The last segment's maximum rescales the sums of all the earlier ones."""
    n_cols = 3 * SMALL_SEG + 3
    logits = torch.randn(4, n_cols, device=device)
    logits[:, -1] = 30.0  # in the 1-class last segment: exp(x - max) underflows elsewhere
    logits[1, -2] = 40.0
    target = torch.tensor([0, n_cols - 1, SMALL_SEG, -100], device=device)
    _compare(logits, target, reduction="none", label_smoothing=0.1, config=small_seg)
    _compare(logits, target, torch.rand(n_cols, device=device) + 0.5, config=small_seg)


@pytest.mark.parametrize("segment", [0, 1])
def test_a_segment_of_minus_inf_adds_nothing(segment, small_seg, device):
    """A segment whose logits are all -inf: softmax 0 there, no NaN anywhere."""
    n_cols = 3 * SMALL_SEG
    logits = torch.randn(3, n_cols, device=device)
    logits[:, segment * SMALL_SEG : (segment + 1) * SMALL_SEG] = float("-inf")
    target = torch.tensor([2 * SMALL_SEG, 2 * SMALL_SEG + 1, -100], device=device)
    loss, grad = _compare(logits, target, reduction="none", config=small_seg)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert not grad[:, segment * SMALL_SEG : (segment + 1) * SMALL_SEG].any()
    _compare(logits, target, torch.rand(n_cols, device=device) + 0.5, config=small_seg)


def test_segments_of_strided_logits(small_seg, device):
    """Class stride != 1: a transposed copy (class stride N) and every other column."""
    n_cols = 2 * SMALL_SEG + 7
    base = torch.randn(6, 2 * n_cols, device=device)
    target = torch.randint(0, n_cols, (6,), device=device)
    target[4] = -100
    weight = torch.rand(n_cols, device=device) + 0.5
    for logits in (base[:, :n_cols].t().contiguous().t(), base[:, ::2]):
        assert logits.stride(1) != 1
        _compare(logits, target, weight, reduction="none", label_smoothing=0.3, config=small_seg)
        _compare(logits, target, config=small_seg)


def test_int64_index_path(small_seg, device):
    """The 64-bit index arithmetic (taken past 2**31 elements) forced on a small input."""
    small_seg = dataclasses.replace(small_seg, int64=True)
    n_cols = 2 * SMALL_SEG + 3
    logits = torch.randn(5, 2 * n_cols, device=device)[:, ::2]
    target = torch.tensor([0, n_cols - 1, -100, SMALL_SEG, 7], device=device)
    _compare(
        logits,
        target,
        torch.rand(n_cols, device=device) + 0.5,
        label_smoothing=0.1,
        config=small_seg,
    )


@pytest.mark.slow
@pytest.mark.parametrize("n_cols", [2 * SMALL_SEG + 5, 3 * SMALL_SEG + 7, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_aligned_segments(n_cols, dtype, small_seg, device):
    """Odd widths: each row's segments start at its first 16-byte aligned class, the edge
    around that body goes with segment 0 (align). Targets, -inf, and the row maximum sit in
    the edges; the result matches F.cross_entropy in float64 and the plain segments."""
    n_rows = 1 if n_cols < SMALL_SEG else 9
    logits = (torch.randn(n_rows, n_cols, device=device) * 3).to(dtype)
    line = 128 // logits.element_size()
    assert align_for(ce_config(n_rows, n_cols, small_seg)[0], small_seg, logits) == line
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    if n_rows > 1:
        target[:4] = torch.tensor([0, n_cols - 1, -100, 1])
        logits[0, 0] = 12.0  # row maximum in row 0's head (row 0 starts aligned: no head,
        logits[3, 0] = 12.0  # so it is in the body); row 3 starts 3 * n_cols into the buffer
        logits[4, -1] = 12.0
        logits[5, :2] = float("-inf")
        logits[6, -2:] = float("-inf")
    weight = torch.rand(n_cols, device=device) + 0.5
    results = []
    for align in (True, False):
        config = dataclasses.replace(small_seg, align=align)
        for kwargs in ({"reduction": "none"}, {"reduction": "mean", "label_smoothing": 0.2}):
            for w in (None, weight):
                x = logits.detach().clone().requires_grad_()
                loss = ce(x, target, w, **kwargs, config=config)
                g = torch.linspace(0.5, 1.5, loss.numel(), device=device).reshape(loss.shape)
                (grad,) = torch.autograd.grad(loss, x, g.to(loss.dtype))
                xd = logits.detach().double().requires_grad_()
                ref = F.cross_entropy(xd, target, None if w is None else w.double(), **kwargs)
                (gd,) = torch.autograd.grad(ref, xd, g.double())
                tol = 1e-5 if dtype == torch.float32 else 4e-3
                torch.testing.assert_close(loss.double(), ref, rtol=tol, atol=tol)
                torch.testing.assert_close(grad.double(), gd, rtol=tol, atol=tol)
                results.append((loss, grad))
    # The two walks add the same float32 terms in a different order: the loss, lse - x[target]
    # with lse near 12, may differ by an ulp of lse (1e-6), and a half-precision output may
    # then round one of its own ulps apart (2**-10 relative).
    same = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 1e-5}
    half = len(results) // 2
    for (la, ga), (lp, gp) in zip(results[:half], results[half:]):
        torch.testing.assert_close(la, lp, **same)
        torch.testing.assert_close(ga, gp, **same)


def test_align_routing(small_seg, device):
    """Which layouts take the aligned walk: one row per program, contiguous classes, 16-byte
    aligned bases, equal row offsets within 128 bytes, and rows or a width not provably
    aligned."""
    bf = {"device": device, "dtype": torch.bfloat16}
    odd = torch.randn(4, 41, **bf)
    c = small_seg
    assert align_for(1, c, odd) == 64
    assert align_for(1, c, odd, torch.empty_like(odd)) == 64
    assert align_for(2, c, odd) == 0  # row tiles
    assert align_for(1, c, torch.randn(4, 48, **bf)) == 0  # aligned already
    assert align_for(1, c, torch.randn(4, 64, **bf)[:, :40]) == 64  # width 40: not provable
    assert align_for(1, c, torch.randn(4, 64, **bf)[:, :48]) == 0
    assert align_for(1, c, torch.randn(4, 82, **bf)[:, ::2]) == 0  # strided classes
    assert align_for(1, c, torch.randn(4, 42, **bf)[:, 1:]) == 0  # base off 16 bytes
    assert align_for(1, c, odd, torch.empty(4, 48, **bf)[:, :41]) == 0  # other row offsets
    assert align_for(1, c, torch.randn(4, 41, device=device)) == 32
    assert align_for(1, c, odd, torch.empty(4, 41 + 64, **bf)[:, :41]) == 64  # 105 = 41 + 64
    assert align_for(1, c, odd, torch.empty(4, 41 + 8, **bf)[:, :41]) == 0  # 16 bytes apart


def test_segments_in_bfloat16(small_seg, device):
    """Loss and gradient within twice PyTorch's own bf16 error of the float64 result, plus two
    bf16 steps: the gradient is rounded to bf16 twice (forward, then the in-place scaling),
    and the CPU interpreter truncates where the GPU rounds to nearest."""
    n_cols = 2 * SMALL_SEG + 9
    logits = (torch.randn(6, n_cols, device=device) * 4).bfloat16()
    target = torch.randint(0, n_cols, (6,), device=device)
    target[2] = -100
    ours_in = logits.clone().requires_grad_()
    bf_in = logits.clone().requires_grad_()
    ref_in = logits.double().requires_grad_()
    kwargs = {"reduction": "none", "label_smoothing": 0.1}
    g = torch.randn(6, device=device)
    outs = []
    ours = lambda *args, **kw: ce(*args, **kw, config=small_seg)  # noqa: E731
    for x, fn in ((ours_in, ours), (bf_in, F.cross_entropy), (ref_in, F.cross_entropy)):
        loss = fn(x, target, **kwargs)
        (grad,) = torch.autograd.grad(loss, x, g.to(loss.dtype))
        outs.append((loss.double(), grad.double()))
    for ours, torch_bf16, ref in zip(*outs):
        bound = 2 * (torch_bf16 - ref).abs() + ref.abs() * 2**-6 + 1e-6
        assert ((ours - ref).abs() <= bound).all()


# ---- memory and side effects ----------------------------------------------------------------


def test_gradient_is_written_everywhere_and_logits_untouched(device):
    logits = torch.randn(9, 33, device=device, requires_grad=True)
    before = logits.detach().clone()
    target = torch.randint(0, 33, (9,), device=device)
    target[::4] = -100  # ignored rows must get zeros, not whatever the allocation held
    with poisoned_allocations():
        loss = cross_entropy(logits, target, label_smoothing=0.1)
        (grad,) = torch.autograd.grad(loss, logits)
    assert torch.isfinite(grad).all() and not grad[::4].any()
    assert torch.equal(logits.detach(), before)


def test_no_n_by_c_float32_tensor_is_allocated(device, monkeypatch):
    n, c = 12, 50
    logits = torch.randn(n, c, device=device, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, c, (n,), device=device)
    seen = []
    for name in ("empty", "empty_like", "empty_strided", "zeros", "zeros_like"):
        original = getattr(torch, name)

        def record(*args, _original=original, **kwargs):
            t = _original(*args, **kwargs)
            seen.append((tuple(t.shape), t.dtype))
            return t

        monkeypatch.setattr(torch, name, record)
    loss = cross_entropy(logits, target, label_smoothing=0.1)
    torch.autograd.grad(loss * 2, logits)
    monkeypatch.undo()
    assert ((n, c), torch.bfloat16) in seen  # the gradient, in the logits' dtype
    assert not [s for s in seen if s[1] == torch.float32 and s[0] and s[0][0] * s[0][-1] >= n * c]


def test_second_backward_through_the_same_graph_gives_the_same_gradient(device):
    logits = torch.randn(4, 6, device=device, requires_grad=True)
    loss = cross_entropy(logits, torch.randint(0, 6, (4,), device=device))
    (first,) = torch.autograd.grad(loss * 3, logits, retain_graph=True)
    (second,) = torch.autograd.grad(loss * 3, logits)
    assert torch.equal(first, second)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_backward_applies_grad_output_of_any_layout(device, reduction):
    # A loss scale (a scalar) and, for "none", a per-row grad_output that is a strided view
    # and one that is expanded (stride 0), as loss.sum() or loss.mean() pass it.
    gen = torch.Generator(device=device).manual_seed(5)
    logits = torch.randn(6, 37, device=device, generator=gen, dtype=torch.float32)
    target = torch.randint(0, 37, (6,), device=device, generator=gen)
    target[2] = -100
    weight = torch.rand(37, device=device, generator=gen) + 0.5
    kwargs = {"weight": weight, "reduction": reduction, "label_smoothing": 0.2}
    if reduction == "none":
        grads = [
            torch.randn(12, device=device, generator=gen)[::2],
            torch.full((), -1.5, device=device).expand(6),
        ]
    else:
        grads = [torch.full((), 1024.0, device=device)]
    for grad_output in grads:
        x = logits.clone().requires_grad_()
        (ours,) = torch.autograd.grad(cross_entropy(x, target, **kwargs), x, grad_output)
        x_ref = logits.clone().requires_grad_()
        (ref,) = torch.autograd.grad(F.cross_entropy(x_ref, target, **kwargs), x_ref, grad_output)
        torch.testing.assert_close(ours, ref)


def test_no_gradient_work_without_requires_grad(device):
    logits = torch.randn(4, 6, device=device)
    loss = cross_entropy(logits, torch.randint(0, 6, (4,), device=device))
    assert loss.grad_fn is None
    with torch.no_grad():
        x = logits.clone().requires_grad_()
        assert cross_entropy(x, torch.zeros(4, dtype=torch.int64, device=device)).grad_fn is None


# ---- bad inputs ----------------------------------------------------------------------------


def test_bad_inputs_are_reported(device):
    x = torch.randn(4, 6, device=device)
    t = torch.randint(0, 6, (4,), device=device)
    with pytest.raises(
        TypeError, match=r"target of shape \(4,\) .* must have dtype int64, got float32"
    ):
        cross_entropy(x, t.float())
    with pytest.raises(TypeError, match=r"target must have dtype int64, got int32"):
        cross_entropy(x, t.int())
    with pytest.raises(ValueError, match=r"target must have shape \(4,\) .* got \(5,\)"):
        cross_entropy(x, torch.zeros(5, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"weight must have shape \(C,\) = \(6,\), got \(5,\)"):
        cross_entropy(x, t, torch.ones(5, device=device))
    with pytest.raises(ValueError, match=r"reduction must be one of \['mean', 'sum', 'none'\]"):
        cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\], got 1.5"):
        cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(
        ValueError, match=r"target must have shape \(1, 6\) for input of shape \(1, 4, 6\)"
    ):
        cross_entropy(x[None], t[None])
    with pytest.raises(TypeError, match="ignore_index must be an int, got float"):
        cross_entropy(x, t, ignore_index=-100.0)


# ---- module and compile --------------------------------------------------------------------


def test_module_loads_the_torch_state_dict(device):
    weight = torch.rand(7, device=device) + 0.5
    ref = torch.nn.CrossEntropyLoss(weight=weight, ignore_index=1, label_smoothing=0.1)
    ours = CrossEntropyLoss(
        weight=torch.ones(7, device=device), ignore_index=1, label_smoothing=0.1
    )
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 7, device=device)
    t = torch.tensor([0, 1, 6, 3, 1], device=device)
    torch.testing.assert_close(ours(x, t), ref(x, t), rtol=1e-5, atol=1e-6)
    assert CrossEntropyLoss(reduction="sum").reduction == "sum"


def test_compile_fullgraph_traces(device):
    torch._dynamo.reset()
    backend = compile_backend(device)

    def fn(x, t):
        return cross_entropy(x * 2, t, label_smoothing=0.1) + cross_entropy(x, t, reduction="sum")

    def ref(x, t):
        return F.cross_entropy(x * 2, t, label_smoothing=0.1) + F.cross_entropy(
            x, t, reduction="sum"
        )

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    x = torch.randn(6, 10, device=device, requires_grad=True)
    t = torch.randint(0, 10, (6,), device=device)
    out, expected = compiled(x, t), ref(x, t)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    (got,) = torch.autograd.grad(out, x)
    (want,) = torch.autograd.grad(expected, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# ---- class-probability targets ----------------------------------------------------------------

# Each output rounded once from float32 arithmetic: half an ulp of its dtype, relative, over the
# float32 error (1e-5 relative, 1e-6 absolute, as _compare's).
_ROUNDING = {torch.float32: 1e-5, torch.float16: 2**-11 + 1e-5, torch.bfloat16: 2**-8 + 1e-5}


def _close(got, want, **kwargs):
    """``got`` within one rounding to its dtype of the float64 ``want`` (NaN and inf where it
    has them)."""
    rtol = _ROUNDING[got.dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=1e-6, equal_nan=True, **kwargs)


def _soft(x, t, weight=None, grad_output=None, config=None, target_grad=True, **kwargs):
    """Loss and the gradients of the logits and of the target against F.cross_entropy in
    float64 on the same values; returns (loss, logits' gradient, target's gradient)."""
    xa = x.detach().clone().requires_grad_()
    ta = t.detach().clone().requires_grad_(target_grad)
    xd = x.detach().double().requires_grad_()
    td = t.detach().double().requires_grad_(target_grad)
    wd = None if weight is None else weight.double()
    loss = ce(xa, ta, weight, **kwargs, config=config)
    ref = F.cross_entropy(xd, td, wd, **kwargs)
    assert loss.dtype == _promoted(x, t, weight) and loss.shape == ref.shape
    _close(loss, ref)
    g = torch.randn(loss.shape, device=loss.device) if grad_output is None else grad_output
    g = g.to(loss.dtype)  # the reference gets the same values
    wrt = (xa, ta) if target_grad else (xa,)
    grads = torch.autograd.grad(loss, wrt, g)
    refs = torch.autograd.grad(ref, (xd, td) if target_grad else (xd,), g.double())
    for got, want, like in zip(grads, refs, (x, t)):
        assert got.dtype == like.dtype and got.shape == like.shape
        _close(got, want)
    return loss, grads[0], (grads[1] if target_grad else None)


def _promoted(x, t, weight):
    dtype = torch.promote_types(x.dtype, t.dtype)
    return dtype if weight is None else torch.promote_types(dtype, weight.dtype)


def _probs(shape, device, dtype=torch.float32, dim=1, scale=2.0):
    return torch.softmax(torch.randn(shape, device=device) * scale, dim=dim).to(dtype)


@pytest.mark.parametrize("smoothing", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_soft_targets_smoothing_weights_reductions(smoothing, reduction, device):
    """Targets need not sum to 1 (PyTorch does not ask it): the last row's do not."""
    x = torch.randn(7, 11, device=device) * 3
    t = _probs((7, 11), device)
    t[-1] = torch.rand(11, device=device)
    for weight in (None, torch.rand(11, device=device) + 0.5):
        _soft(x, t, weight, reduction=reduction, label_smoothing=smoothing)


@pytest.mark.parametrize("n", [1, 7, 129])
@pytest.mark.parametrize(
    "c", [2, 1000, pytest.param(32001, marks=pytest.mark.slow)], ids=["c2", "c1000", "c32001"]
)
def test_soft_targets_at_odd_shapes(n, c, device):
    """The default config: a row in one segment (C = 2, 1000) or several with an odd last
    one (32001, segments of 8192), rows of odd lengths sharing tiles."""
    x = torch.randn(n, c, device=device)
    _soft(x, _probs((n, c), device), reduction="mean", label_smoothing=0.1)


def test_soft_targets_32001_classes_fast(device):
    """One row of an odd vocabulary in the fast tier (more rows are in the slow one), weighted:
    4 segments of 8192 classes, the last partial."""
    x = torch.randn(1, 32001, device=device)
    _soft(x, _probs((1, 32001), device), torch.rand(32001, device=device) + 0.5, reduction="sum")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_soft_targets_in_half_precision(dtype, device):
    """Loss and gradients from 16-bit logits and targets within one rounding of the float64
    answer on the same values (PyTorch rounds log_softmax to 16 bits first: much further)."""
    x = (torch.randn(9, 37, device=device) * 3).to(dtype)
    t = _probs((9, 37), device, dtype)
    w = (torch.rand(37, device=device) + 0.5).to(dtype)
    _soft(x, t, reduction="none", label_smoothing=0.1)
    _soft(x, t, w, reduction="mean")


@pytest.mark.parametrize(
    "x_dtype,t_dtype,w_dtype",
    [
        (torch.bfloat16, torch.float32, None),
        (torch.float16, torch.bfloat16, None),
        (torch.float32, torch.float16, torch.bfloat16),
        (torch.bfloat16, torch.bfloat16, torch.float32),
    ],
)
def test_soft_targets_of_their_own_dtype(x_dtype, t_dtype, w_dtype, device):
    """The loss in PyTorch's promotion of the three dtypes; each gradient in its input's."""
    x = torch.randn(5, 23, device=device).to(x_dtype)
    t = _probs((5, 23), device, t_dtype)
    w = None if w_dtype is None else (torch.rand(23, device=device) + 0.5).to(w_dtype)
    _soft(x, t, w, reduction="none", label_smoothing=0.2)
    _soft(x, t, w, reduction="mean")


def test_soft_targets_far_from_zero(device):
    """Logits near 10^4: the loss is summed from non-negative terms around each segment's
    maximum, so it keeps float32's relative precision (``lse * sum(t) - sum(t * x)`` would
    lose it in the rounding of lse alone, up to 2**-11 * sum(t): 1e-4 of a loss near 5)."""
    x = torch.randn(6, 300, device=device) + 1e4
    t = _probs((6, 300), device, scale=0.3)
    _soft(x, t, reduction="none")
    _soft(x, t, reduction="none", config=dataclasses.replace(CROSS_ENTROPY, soft_seg=64))


def test_soft_targets_non_contiguous(device):
    """Logits and target in other layouts than each other (class stride 2, transposed), and a
    strided grad_output."""
    base = torch.randn(13, 2 * 10, device=device)
    t = _probs((10, 13), device, dim=0).t()  # class stride 1, rows 1 apart: transposed
    go = torch.randn(26, device=device)[::2]
    _soft(base[:, ::2], t, reduction="none", grad_output=go)
    _soft(base[:, ::2].contiguous(), t.contiguous()[:, :], label_smoothing=0.1)
    _soft(base[:, 1::2], _probs((13, 10), device)[:, :], torch.rand(10, device=device) + 0.5)


def test_soft_target_one_dim_input(device):
    x = torch.randn(9, device=device)
    _soft(x, _probs((9,), device, dim=0), reduction="none")
    _soft(x, _probs((9,), device, dim=0), torch.rand(9, device=device) + 0.5)


def test_soft_target_gradient_only_where_required(device):
    """Logits that need no gradient: only the target's is written (and the reverse)."""
    x = torch.randn(4, 9, device=device)
    t = _probs((4, 9), device).requires_grad_()
    loss = cross_entropy(x, t, label_smoothing=0.1)
    (gt,) = torch.autograd.grad(loss, t)
    td = t.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(F.cross_entropy(x.double(), td, label_smoothing=0.1), td)
    _close(gt, want)
    xg = x.clone().requires_grad_()
    loss = cross_entropy(xg, t.detach())
    assert loss.grad_fn is not None
    (gx,) = torch.autograd.grad(loss, xg)
    assert gx.shape == x.shape and t.grad is None


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_soft_targets_nan_and_inf_as_torch(reduction, device):
    """-inf logits where the target is 0 (0 * -inf: NaN, as PyTorch's log_softmax * target)
    and where it is not (+inf loss); NaN and +inf logits; a row all -inf; and their
    gradients."""
    x = torch.randn(6, 8, device=device)
    t = _probs((6, 8), device)
    x[0, 1], t[0, 1] = float("-inf"), 0.0  # NaN loss, finite gradient
    x[1, 2] = float("-inf")  # +inf loss
    x[2, 3] = float("nan")
    x[3, 4] = float("inf")
    x[4] = float("-inf")
    xa = x.clone().requires_grad_()
    xd = x.double().requires_grad_()
    loss = cross_entropy(xa, t, reduction=reduction)
    ref = F.cross_entropy(xd, t.double(), reduction=reduction)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6, equal_nan=True)
    g = torch.ones_like(loss)
    (got,) = torch.autograd.grad(loss, xa, g)
    (want,) = torch.autograd.grad(ref, xd, g.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("shape", [(0, 5), (2, 5, 0), (0, 5, 3, 2)])
def test_soft_targets_empty(shape, device):
    """No rows: mean NaN (PyTorch's 0 / 0), sum 0, none empty; empty gradients."""
    for reduction in ("mean", "sum", "none"):
        x = torch.randn(shape, device=device, requires_grad=True)
        t = torch.rand(shape, device=device, requires_grad=True)
        loss = cross_entropy(x, t, reduction=reduction)
        ref = F.cross_entropy(x.detach(), t.detach(), reduction=reduction)
        assert loss.shape == ref.shape
        torch.testing.assert_close(loss, ref, equal_nan=True)
        gx, gt = torch.autograd.grad(loss.sum(), (x, t))
        assert gx.shape == x.shape and gt.shape == t.shape


def test_soft_segments(device):
    """Rows cut into segments of 16 (config.soft_seg): partials merged per row, the maximum in
    the last (1-class) segment, a segment all -inf, weights and smoothing."""
    config = dataclasses.replace(CROSS_ENTROPY, soft_seg=SMALL_SEG)
    n_cols = 3 * SMALL_SEG + 1
    x = torch.randn(5, n_cols, device=device) * 2
    x[:, -1] = 30.0
    x[2, :SMALL_SEG] = float("-inf")
    t = _probs((5, n_cols), device)
    w = torch.rand(n_cols, device=device) + 0.5
    for kwargs in ({"reduction": "none"}, {"reduction": "mean", "label_smoothing": 0.2}):
        _soft(x, t, None, config=config, **kwargs)
        _soft(x, t, w, config=config, **kwargs)
    # Rows shorter than a segment share a tile (BLOCK_M > 1).
    _soft(x[:, :5], t[:, :5], config=config, reduction="none")


@pytest.mark.slow  # aligned walks of class indices: test_align_routing in the fast tier
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_soft_aligned_segments(dtype, device):
    """An odd width: segments walk each row's aligned body (logits and target, and the
    gradients, share one head), the edge goes with the row kernel and segment 0."""
    small = dataclasses.replace(CROSS_ENTROPY, soft_seg=SMALL_SEG)
    n_cols = 2 * SMALL_SEG + 5
    x = (torch.randn(9, n_cols, device=device) * 3).to(dtype)
    x[3, 0] = 12.0  # a row maximum in row 3's head
    x[4, -1] = 12.0  # and in row 4's tail
    t = _probs((9, n_cols), device, dtype)
    w = torch.rand(n_cols, device=device) + 0.5
    line = 128 // x.element_size()
    assert align_for(1, small, x, t) == line
    outs = []
    for align in (True, False):
        config = dataclasses.replace(small, align=align)
        g = torch.linspace(0.5, 1.5, 9, device=device)
        outs.append(_soft(x, t, w, config=config, reduction="none", grad_output=g,
                          label_smoothing=0.1))  # fmt: skip
    # The two walks add the same float32 terms in another order, and each rounds its result
    # once: 16-bit outputs may land one of their ulps apart.
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=2 * _ROUNDING[a.dtype], atol=1e-6)


def test_soft_int64_index_path(device):
    config = dataclasses.replace(CROSS_ENTROPY, soft_seg=SMALL_SEG, int64=True)
    x = torch.randn(5, 2 * 37, device=device)[:, ::2]
    _soft(x, _probs((5, 37), device), torch.rand(37, device=device) + 0.5, config=config,
          label_smoothing=0.1)  # fmt: skip


def test_soft_no_n_by_c_float32_tensor(device, monkeypatch):
    """bf16 logits and target: the only N x C allocations are the two gradients, in bf16."""
    n, c = 12, 50
    x = torch.randn(n, c, device=device, dtype=torch.bfloat16, requires_grad=True)
    t = _probs((n, c), device, torch.bfloat16).requires_grad_()
    seen = []
    for name in ("empty", "empty_like", "empty_strided", "zeros", "zeros_like"):
        original = getattr(torch, name)

        def record(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            seen.append((tuple(out.shape), out.dtype))
            return out

        monkeypatch.setattr(torch, name, record)
    for _ in range(2):  # the first call builds the plans (which allocate like the calls)
        seen.clear()
        loss = cross_entropy(x, t, label_smoothing=0.1)
        torch.autograd.grad(loss * 2, (x, t))
    monkeypatch.undo()
    assert seen.count(((n, c), torch.bfloat16)) == 2  # the gradients
    big = [s for s in seen if s[0] and s[0][-1] * s[0][0] >= n * c and s[1] != torch.bfloat16]
    assert not big, big


def test_soft_inputs_untouched_and_gradients_written_everywhere(device):
    x = torch.randn(9, 33, device=device, requires_grad=True)
    t = _probs((9, 33), device).requires_grad_()
    before = (x.detach().clone(), t.detach().clone())
    with poisoned_allocations():
        loss = cross_entropy(x, t, torch.rand(33, device=device) + 0.5, label_smoothing=0.1)
        gx, gt = torch.autograd.grad(loss, (x, t))
    assert torch.isfinite(gx).all() and torch.isfinite(gt).all()
    assert torch.equal(x.detach(), before[0]) and torch.equal(t.detach(), before[1])


def test_soft_bad_inputs(device):
    x = torch.randn(4, 6, device=device)
    t = _probs((4, 6), device)
    with pytest.raises(ValueError, match=r"target must be class indices \(int64\) of shape \(4,\) "
                       r"or class probabilities of input's shape \(4, 6\), got a float32 target "
                       r"of shape \(4, 5\)"):  # fmt: skip
        cross_entropy(x, t[:, :5])
    with pytest.raises(TypeError, match=r"target of input's shape \(4, 6\) holds class "
                       r"probabilities and must have dtype float32, float16 or bfloat16, got "
                       r"int64"):  # fmt: skip
        cross_entropy(x, t.long())
    with pytest.raises(TypeError, match=r"target must have dtype float32, float16, bfloat16, "
                       r"got float64"):  # fmt: skip
        cross_entropy(x, t.double())
    with pytest.raises(ValueError, match=r"ignore_index must be negative .* got 0"):
        cross_entropy(x, t, ignore_index=0)
    with pytest.raises(ValueError, match=r"weight must have shape \(C,\) = \(6,\), got \(4,\)"):
        cross_entropy(x, t, torch.ones(4, device=device))
    with pytest.raises(TypeError, match=r"weight must have dtype .* got int64"):
        cross_entropy(x, t, torch.ones(6, device=device, dtype=torch.int64))
    w = torch.ones(6, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="weight must not require grad with class-probability"):
        cross_entropy(x, t, w)
    with torch.no_grad():
        cross_entropy(x, t, w)  # no gradient can follow: nothing to refuse


# ---- K-dimensional inputs (N, C, d1, ..., dk) ------------------------------------------------


def _kdim_cases(device, n=2, c=7, d=(3, 5)):
    """Logits (N, C, *d) in four layouts: contiguous (class stride d1 * d2), channels-last (one
    row stride: its rows collapse to (N * d, C)), positions transposed, and a slice whose
    positions do not flatten into one dim (flatten copies it)."""
    base = torch.randn(n, c, *d, device=device)
    return {
        "contiguous": base,
        "channels-last": base.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),
        "positions-transposed": base.transpose(2, 3).contiguous().transpose(2, 3),
        "sliced": torch.randn(n, c, d[0], 2 * d[1] + 1, device=device)[..., 1::2],
    }


@pytest.mark.parametrize(
    "layout", ["contiguous", "channels-last", "positions-transposed", "sliced"]
)
def test_kdim_class_indices(layout, device):
    x = _kdim_cases(device)[layout]
    target = torch.randint(0, 7, (2, 3, 5), device=device)
    target[0, 1, 2] = target[1, 2, 4] = -100
    w = torch.rand(7, device=device) + 0.5
    go = torch.randn(2, 5, 3, device=device).transpose(1, 2)  # strided (N, d1, d2)
    _compare(x, target, reduction="none", grad_output=go)
    _compare(x, target, w, reduction="mean", label_smoothing=0.1)
    _compare(x, target.transpose(1, 2).contiguous().transpose(1, 2), w, reduction="sum")
    _compare(x, torch.where(target == -100, 3, target), w, reduction="none", ignore_index=3)


@pytest.mark.parametrize(
    "layout", ["contiguous", "channels-last", "positions-transposed", "sliced"]
)
def test_kdim_class_probabilities(layout, device):
    x = _kdim_cases(device)[layout]
    t = _probs(x.shape, device)
    w = torch.rand(7, device=device) + 0.5
    _soft(x, t, reduction="none", grad_output=torch.randn(2, 5, 3, device=device).transpose(1, 2))
    _soft(x, t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2), w, label_smoothing=0.2)
    _soft(x, t, w, reduction="sum")


def test_kdim_one_and_three_positions_dims(device):
    x3 = torch.randn(4, 6, 5, device=device)
    t3 = torch.randint(0, 6, (4, 5), device=device)
    _compare(x3, t3, reduction="none")
    _soft(x3, _probs((4, 6, 5), device), label_smoothing=0.1)
    x5 = torch.randn(2, 3, 2, 3, 2, device=device)
    _compare(x5, torch.randint(0, 3, (2, 2, 3, 2), device=device), reduction="none")
    _soft(x5, _probs(x5.shape, device), reduction="none")
    x1 = torch.randn(3, 4, 1, device=device)  # one position: as (N, C)
    _compare(x1, torch.randint(0, 4, (3, 1), device=device))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kdim_in_half_precision(dtype, device):
    x = torch.randn(3, 5, 3, 5, device=device).to(dtype)
    _soft(x, _probs(x.shape, device, dtype), reduction="none", label_smoothing=0.1)
    t = torch.randint(0, 5, (3, 3, 5), device=device)
    xa = x.clone().requires_grad_()
    xd = x.double().requires_grad_()
    loss = cross_entropy(xa, t, reduction="none")
    ref = F.cross_entropy(xd, t, reduction="none")
    _close(loss, ref)
    g = torch.randn(loss.shape, device=device).to(dtype)  # the reference gets the same values
    _close(torch.autograd.grad(loss, xa, g)[0], torch.autograd.grad(ref, xd, g.double())[0])


def test_kdim_empty(device):
    for shape in ((0, 4, 3), (2, 4, 0, 5)):
        x = torch.randn(shape, device=device, requires_grad=True)
        t = torch.zeros((shape[0], *shape[2:]), dtype=torch.int64, device=device)
        for reduction in ("mean", "sum", "none"):
            loss = cross_entropy(x, t, reduction=reduction)
            ref = F.cross_entropy(x.detach(), t, reduction=reduction)
            assert loss.shape == ref.shape
            torch.testing.assert_close(loss, ref, equal_nan=True)
            (g,) = torch.autograd.grad(loss.sum(), x)
            assert g.shape == x.shape


def test_kdim_out_of_range_target_raises(device):
    if device.type == "cuda":
        pytest.skip("a device-side assert: test_out_of_range_target_raises runs it in a subprocess")
    x = torch.randn(2, 4, 3, device=device)
    t = torch.zeros(2, 3, dtype=torch.int64, device=device)
    t[1, 2] = 4
    with pytest.raises(IndexError, match=r"target must be in \[0, 4\).* got 4"):
        cross_entropy(x, t)


def test_kdim_bad_target_shape(device):
    x = torch.randn(2, 4, 3, 5, device=device)
    with pytest.raises(ValueError, match=r"target must have shape \(2, 3, 5\) for input of shape"):
        cross_entropy(x, torch.zeros(2, 5, 3, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"class probabilities of input's shape \(2, 4, 3, 5\)"):
        cross_entropy(x, torch.rand(2, 4, 5, 3, device=device))


def test_kdim_rows_collapse_where_evenly_strided(device):
    """Which layouts the kernels address with one row stride (n_inner 1) and which with two."""
    x = torch.empty(2, 7, 15, device=device)
    t = torch.empty(2, 15, dtype=torch.int64, device=device)
    assert row_strides(2, 15, x, t).n_inner == 15  # classes between positions
    cl = x.permute(0, 2, 1).contiguous().permute(0, 2, 1)
    assert row_strides(2, 15, cl, t) == type(row_strides(2, 15, cl, t))(30, 1, ((7, 0), (1, 0)))
    assert row_strides(1, 15, x, t[:1]).n_inner == 1  # one sample: positions are the rows
    assert row_strides(2, 1, x[:, :, :1], t[:, :1]).strides == ((105, 0), (15, 0))


def _aten_copies(fn):
    """(fn's result, the ATen ops that copied data while it ran)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    copies = []

    class Copies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("clone", "copy_", "_to_copy", "contiguous"):
                copies.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Copies():
        out = fn()
    return out, copies


def test_kdim_layouts_are_read_in_place_but_the_unflattenable(device):
    """No copy of the logits or the target where the positions flatten into one stride
    (contiguous, channels-last); flatten's copy where they do not (positions transposed or
    sliced): the kernels address a row through two strides, sample and position."""
    copied = {"positions-transposed", "sliced"}
    for layout, x in _kdim_cases(device).items():
        t = _probs(x.shape, device)  # contiguous: flattens as it is
        _, copies = _aten_copies(lambda x=x, t=t: cross_entropy(x, t))
        assert len(copies) == (layout in copied), (layout, copies)


def test_kdim_channels_last_gradient_keeps_the_layout(device):
    x = _kdim_cases(device)["channels-last"].requires_grad_()
    (g,) = torch.autograd.grad(cross_entropy(x, torch.randint(0, 7, (2, 3, 5), device=device)), x)
    assert g.stride() == x.stride()


# ---- class probabilities and K-dim: spec, module, compile, autocast ---------------------------


@pytest.mark.slow
def test_soft_spec_passes_the_check_engine_with_the_target_gradient(device):
    """Every shape x dtype x variant of cross_entropy_soft, the target's gradient checked too."""
    spec = dataclasses.replace(get_spec("cross_entropy_soft"), grad_inputs=(0, 1))
    seed = fresh_seed()
    results = check_spec(spec, device=device, seed=seed)
    failed = [r for r in results if not r.passed and not r.skipped]
    report = "\n".join(f"{r.params} {r.shape} {r.dtype} {r.case}: {r.detail}" for r in failed[:10])
    assert results and not failed, f"base seed {seed}: {len(failed)} failed\n{report}"


def test_soft_and_kdim_specs_pass_one_check_each(device):
    assert_spec_passes(
        "cross_entropy_soft", device, shapes=[(2, 7, 3, 5)], dtypes=[torch.float32],
        cases=("random", "transpose", "specials", "grad-transpose", "empty"),
    )  # fmt: skip
    assert_spec_passes(
        "cross_entropy", device, shapes=[(2, 7, 3, 5)], dtypes=[torch.float32],
        cases=("random", "mixed", "specials", "grad", "empty"),
    )  # fmt: skip


def test_module_takes_probabilities_and_positions(device):
    w = torch.rand(5, device=device) + 0.5
    ref = torch.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1)
    ours = CrossEntropyLoss(weight=w, label_smoothing=0.1)
    x = torch.randn(3, 5, 2, 4, device=device)
    for t in (_probs(x.shape, device), torch.randint(0, 5, (3, 2, 4), device=device)):
        torch.testing.assert_close(ours(x, t), ref(x, t), rtol=1e-5, atol=1e-6)


def test_compile_fullgraph_traces_probabilities_and_positions(device):
    torch._dynamo.reset()
    backend = compile_backend(device)

    def fn(f, x, t, tk):
        return f(x * 2, t, label_smoothing=0.1) + f(x, tk, reduction="sum")

    compiled = torch.compile(lambda *a: fn(cross_entropy, *a), fullgraph=True, backend=backend)
    x = torch.randn(3, 6, 2, 5, device=device, requires_grad=True)
    t = _probs(x.shape, device).requires_grad_()
    tk = torch.randint(0, 6, (3, 2, 5), device=device)
    out, expected = compiled(x, t, tk), fn(F.cross_entropy, x, t, tk)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    got = torch.autograd.grad(out, (x, t))
    want = torch.autograd.grad(expected, (x, t))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_soft_loss_is_float32_under_autocast(device):
    x = torch.randn(4, 9, device=device, dtype=torch.bfloat16, requires_grad=True)
    t = _probs((4, 9), device, torch.bfloat16)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = cross_entropy(x, t)
        ref = F.cross_entropy(x, t)
    assert loss.dtype == ref.dtype == torch.float32
    (g,) = torch.autograd.grad(loss, x)
    assert g.dtype == torch.bfloat16
