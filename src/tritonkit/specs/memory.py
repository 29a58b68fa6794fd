"""Specs of the memory-access family: coalesced copy and tiled vs strided transpose."""

import tritonkit
from tritonkit.harness.spec import OpSpec, Shapes, register
from tritonkit.ops.memory import STRIDED, transpose_fwd
from tritonkit.specs._common import generator, nbytes, randn, torch_baselines

FAMILY = "memory"


def _inputs(shape, dtype, device, seed):
    return (randn(shape, dtype, device, generator(device, seed)),)


def _copy_bytes(inputs, mode, **params):
    # fwd: read x, write the copy. bwd: the gradient passes through (no kernel).
    return {"fwd": 2, "bwd": 0, "fwd+bwd": 2}[mode] * nbytes(inputs[0])


def _copy_ref(x):
    return x.clone()


register(
    OpSpec(
        name="copy",
        family=FAMILY,
        impl=tritonkit.copy,
        reference=_copy_ref,
        make_inputs=_inputs,
        shapes=Shapes(
            test=[(7,), (3, 129), (2, 5, 33)],
            bench=[(16384, 8192)],
            empty=[(0, 3)],
            small=[(64, 3000)],
        ),
        bytes=_copy_bytes,
        baselines=torch_baselines(_copy_ref),
        bench_note=lambda shape, mode: (
            "the gradient passes through: no kernel runs" if mode == "bwd" else None
        ),
        description="coalesced copy: the bandwidth yardstick",
    )
)


def _transpose_ref(x):
    return x.transpose(-2, -1).contiguous()


def _transpose_bytes(inputs, mode, **params):
    # Read x once and write its transpose once; the gradient goes back as a view (no kernel).
    return {"fwd": 2, "bwd": 0, "fwd+bwd": 2}[mode] * nbytes(inputs[0])


register(
    OpSpec(
        name="transpose",
        family=FAMILY,
        impl=tritonkit.transpose,
        reference=_transpose_ref,
        make_inputs=_inputs,
        shapes=Shapes(
            test=[(1, 1), (70, 45), (33, 129), (2, 17, 9)],
            bench=[(16384, 8192)],
            empty=[(0, 4), (3, 0)],
            small=[(64, 3000)],
        ),
        bytes=_transpose_bytes,
        baselines=torch_baselines(_transpose_ref),
        bench_note=lambda shape, mode: (
            "the gradient goes back as a transposed view: no kernel runs (as in PyTorch)"
            if mode == "bwd"
            else None
        ),
        variants={
            "strided": lambda x: transpose_fwd(x, STRIDED),
            "coalesced copy": tritonkit.copy,
        },
        description="materialized transpose through shared-memory tiles; strided variant beside it",
    )
)
