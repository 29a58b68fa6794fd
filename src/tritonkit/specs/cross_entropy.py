"""Specs of the cross-entropy family: class-index targets (weights, smoothing, ignore_index) and
class-probability targets (weights, smoothing), over (N, C) and K-dimensional (N, C, d1, d2)
logits. A shape is the logits' shape."""

import torch
import torch.nn.functional as F

from tritonkit.harness.spec import Baseline, OpSpec, Shapes, Unavailable, register
from tritonkit.ops.cross_entropy import cross_entropy
from tritonkit.specs._common import generator, nbytes, randn, torch_baselines

FAMILY = "cross_entropy"
IGNORED = -100  # make_inputs marks every fourth row (from the fourth) with this target


def _inputs(shape, dtype, device, seed):
    """(logits, targets, class weights): targets int64 (N, d1, ...), some ignored; weights in
    [0.5, 1.5)."""
    n, c, *positions = shape
    gen = generator(device, seed)
    logits = randn(shape, dtype, device, gen)
    target = torch.randint(0, c, (n, *positions), generator=gen, device=device)
    target.view(-1)[3::4] = IGNORED
    weight = (torch.rand(c, generator=gen, device=device) + 0.5).to(dtype)
    return logits, target, weight


def _soft_inputs(shape, dtype, device, seed):
    """(logits, class probabilities, class weights): the target a softmax over the classes
    (dim 1) of scaled normals, in the logits' dtype; weights in [0.5, 1.5)."""
    c = shape[1]
    gen = generator(device, seed)
    logits = randn(shape, dtype, device, gen)
    target = torch.softmax(2 * randn(shape, torch.float32, device, gen), dim=1).to(dtype)
    weight = (torch.rand(c, generator=gen, device=device) + 0.5).to(dtype)
    return logits, target, weight


def _targets(target, ignore_index):
    # A variant that ignores a real class index moves the marked rows onto it.
    if ignore_index == IGNORED:
        return target
    return torch.where(target == IGNORED, ignore_index, target)


def _ce(logits, target, weight, weighted=False, ignore_index=IGNORED, **kwargs):
    return cross_entropy(
        logits,
        _targets(target, ignore_index),
        weight if weighted else None,
        ignore_index=ignore_index,
        **kwargs,
    )


def _ce_ref(logits, target, weight, weighted=False, ignore_index=IGNORED, **kwargs):
    return F.cross_entropy(
        logits,
        _targets(target, ignore_index),
        weight if weighted else None,
        ignore_index=ignore_index,
        **kwargs,
    )


def _bytes(inputs, mode, weighted=False, **params):
    logits, target, weight = inputs
    small = nbytes(target) + (nbytes(weight) if weighted else 0)
    # fwd: read the logits once. bwd: read them again and write their gradient (the rows'
    # logsumexps, N floats, and the per-row losses are not counted).
    fwd = nbytes(logits) + small
    bwd = 2 * nbytes(logits) + small
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _soft_bytes(inputs, mode, weighted=False, **params):
    logits, target, weight = inputs
    # fwd: read the logits and the target once. bwd: read both again and write the logits'
    # gradient (the spec's grad_inputs; the target's, where asked for, is as many bytes more).
    # The per-row statistics (2 floats per row) and losses are not counted.
    fwd = nbytes(logits, target) + (nbytes(weight) if weighted else 0)
    bwd = fwd + nbytes(logits)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _soft_ce(logits, target, weight, weighted=False, **kwargs):
    return cross_entropy(logits, target, weight if weighted else None, **kwargs)


def _soft_ce_ref(logits, target, weight, weighted=False, **kwargs):
    return F.cross_entropy(logits, target, weight if weighted else None, **kwargs)


def _liger():
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    except ImportError:
        raise Unavailable("liger_kernel not installed") from None

    def run(logits, target, weight, weighted=False, ignore_index=IGNORED, **kwargs):
        target = _targets(target, ignore_index)
        reduction = kwargs.get("reduction", "mean")
        smoothing = kwargs.get("label_smoothing", 0.0)
        w = weight if weighted else None
        try:  # newer releases: (input, target, weight, ignore_index, lse_square_scale, ...)
            out = LigerCrossEntropyFunction.apply(
                logits, target, w, ignore_index, 0.0, smoothing, reduction
            )
        except TypeError:  # older: (input, target, ignore_index, label_smoothing, reduction)
            if weighted:
                raise
            out = LigerCrossEntropyFunction.apply(
                logits, target, ignore_index, smoothing, reduction
            )
        return out[0] if isinstance(out, tuple) else out

    return run


register(
    OpSpec(
        name="cross_entropy",
        family=FAMILY,
        impl=_ce,
        reference=_ce_ref,
        make_inputs=_inputs,
        shapes=Shapes(
            # (2, 7, 3, 5): K-dimensional logits (N, C, d1, d2), targets (N, d1, d2).
            test=[(1, 1), (3, 7), (6, 129), (2, 7, 3, 5)],
            # (8192, 50257): GPT-2's vocabulary, an odd width (CrossEntropyConfig.align).
            bench=[(8192, 128256), (8192, 50257)],
            empty=[(0, 5), (2, 5, 0, 3)],
            small=[(64, 3000)],
        ),
        # Every option is covered in five variants (the interpreter is slow): reductions,
        # smoothing with and without class weights, and a real class index as ignore_index.
        params=(
            {},
            {"reduction": "none"},
            {"reduction": "sum", "label_smoothing": 0.1},
            {"weighted": True, "label_smoothing": 0.2},
            {"weighted": True, "reduction": "none", "ignore_index": 1},
        ),
        bytes=_bytes,
        bench_dtypes=(torch.bfloat16,),
        grad_inputs=(0,),
        baselines={
            **torch_baselines(_ce_ref),
            "liger": Baseline(
                "liger",
                _liger,
                description="Liger-Kernel cross-entropy (writes the gradient over the logits)",
            ),
        },
        description="cross-entropy over (N, C) or (N, C, d1, ...) logits and class indices; the "
        "gradient is written by the backward",
    )
)

register(
    OpSpec(
        name="cross_entropy_soft",
        family=FAMILY,
        impl=_soft_ce,
        reference=_soft_ce_ref,
        make_inputs=_soft_inputs,
        shapes=Shapes(
            test=[(1, 1), (3, 7), (6, 129), (2, 7, 3, 5)],
            # Distillation over Llama 3's vocabulary: a teacher's probabilities as the target.
            bench=[(8192, 128256)],
            empty=[(0, 5), (2, 5, 0, 3)],
            small=[(64, 3000)],
        ),
        params=(
            {},
            {"reduction": "none", "label_smoothing": 0.1},
            {"weighted": True, "reduction": "sum"},
            {"weighted": True, "label_smoothing": 0.2},
        ),
        bytes=_soft_bytes,
        bench_dtypes=(torch.bfloat16,),
        # The logits' gradient, as in distillation (the teacher's probabilities detached); the
        # target's gradient is checked in tests/test_cross_entropy.py.
        grad_inputs=(0,),
        baselines=torch_baselines(_soft_ce_ref),
        description="cross-entropy over class probabilities (a float target of the logits' "
        "shape); no N x C float32 copy",
    )
)
