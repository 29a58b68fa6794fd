"""Specs of the softmax family: softmax and log_softmax over any dim."""

import torch

from tritonkit.harness.spec import Baseline, OpSpec, Shapes, Tolerance, Unavailable, register
from tritonkit.ops.softmax import log_softmax, softmax
from tritonkit.specs._common import generator, nbytes, randn, torch_baselines

FAMILY = "softmax"

# Small and odd for the CPU interpreter (the looped path for long rows is checked by the tests
# with a config whose max_fused_cols is low); on the GPU, 128 MiB and 512 MiB per bf16 tensor.
SHAPES = Shapes(
    test=[(1, 1), (3, 7), (5, 129), (2, 3, 33)],
    # (1335, 50257): a vocabulary-sized odd width, no row 16-byte aligned (ops ALIGNED).
    bench=[(16384, 4096), (4096, 65536), (1335, 50257)],
    empty=[(0, 5), (3, 0)],
    small=[(64, 3000)],
)
# dim=-1 is timed; dim=0 reduces over a non-last dim through strides (no transpose copy).
PARAMS = ({"dim": -1}, {"dim": 0})


# The backward works from the output rounded to the dtype, as PyTorch's does, and the row sum
# in it cancels: on the test shapes (and (2, 20000), (64, 1000)) PyTorch's own same-dtype
# gradient needs an atol of 6.3e-4 (fp16) and 5.2e-3 (bf16) for softmax, 4.3e-3 and 1.7e-2 for
# log_softmax (dx = dy - exp(y) * sum(dy) magnifies the rounding of y by the row sum of dy). The
# bounds allow about 2x that for fp16 and 4x for bf16 (set when Triton's interpreter truncated
# to bfloat16, doubling the rounding error; ops/_core/interpreter.py now rounds as the GPU does,
# and the bounds stay until a GPU run measures tighter ones).
SOFTMAX_GRAD_TOLERANCE = {
    torch.float32: Tolerance(atol=1e-6, rtol=1e-5),
    torch.float16: Tolerance(atol=1.5e-3, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=2e-2, rtol=2.0**-6),
}
LOG_SOFTMAX_GRAD_TOLERANCE = {
    torch.float32: Tolerance(atol=1e-6, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-2, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=7e-2, rtol=2.0**-6),
}


def _inputs(shape, dtype, device, seed):
    return (randn(shape, dtype, device, generator(device, seed)),)


def _bytes(inputs, mode, **params):
    (x,) = inputs
    # fwd: read x, write y. bwd: read dy and y, write dx.
    return {"fwd": 2, "bwd": 3, "fwd+bwd": 5}[mode] * nbytes(x)


def _softmax_ref(x, dim=-1):
    return torch.softmax(x, dim)


def _log_softmax_ref(x, dim=-1):
    return torch.log_softmax(x, dim)


def _liger_softmax():
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
    except ImportError:
        raise Unavailable("liger_kernel not installed (or too old to have softmax)") from None

    def run(x, dim=-1):
        if dim not in (-1, x.dim() - 1):
            raise ValueError(f"liger softmax reduces the last dim only, got dim={dim}")
        return LigerSoftmaxFunction.apply(x)

    return run


register(
    OpSpec(
        name="softmax",
        family=FAMILY,
        impl=softmax,
        reference=_softmax_ref,
        make_inputs=_inputs,
        shapes=SHAPES,
        params=PARAMS,
        bytes=_bytes,
        grad_tolerance=SOFTMAX_GRAD_TOLERANCE,
        baselines={
            **torch_baselines(_softmax_ref),
            "liger": Baseline("liger", _liger_softmax, description="Liger-Kernel softmax"),
        },
        description="softmax over any dim; online (looped) beyond max_fused_cols columns",
    )
)

register(
    OpSpec(
        name="log_softmax",
        family=FAMILY,
        impl=log_softmax,
        reference=_log_softmax_ref,
        make_inputs=_inputs,
        shapes=SHAPES,
        params=PARAMS,
        bytes=_bytes,
        grad_tolerance=LOG_SOFTMAX_GRAD_TOLERANCE,
        baselines=torch_baselines(_log_softmax_ref),
        description="log_softmax over any dim; online (looped) beyond max_fused_cols columns",
    )
)
