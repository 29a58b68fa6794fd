"""Specs of the elementwise family: activations, bias + activation, add, gated units."""

import torch
import torch.nn.functional as F

import tritonkit
from tritonkit.harness.spec import DEFAULT_TOLERANCES, OpSpec, Shapes, Tolerance, register
from tritonkit.specs._common import generator, nbytes, randn, torch_baselines
from tritonkit.specs._cuda_gelu import cuda_gelu_baseline

FAMILY = "elementwise"

# Small, odd and non-power-of-2 for the CPU interpreter; 256 MiB per bf16 tensor on the GPU.
UNARY_SHAPES = Shapes(
    test=[(), (1,), (7,), (3, 129), (2, 5, 33), (1000,)],
    bench=[(16384, 8192)],
    empty=[(0,), (3, 0, 5)],
    small=[(64, 3000)],
)


# Nominal FLOPs per element, for the roofline: the operations of the textbook formula, each
# add/mul/max/exp/erf/tanh counted once (relu max(x, 0); silu x / (1 + exp(-x)) as 4; gelu
# x * 0.5 * (1 + erf(x / sqrt 2)) as 5; gelu_tanh as 9). A backward pass counts twice the
# forward's plus the chain rule's multiply. These are all far below one FLOP per byte: the
# family is memory-bound on any GPU, which is what the roofline should show.
ACT_FLOPS = {None: 0, "none": 0, "relu": 1, "silu": 4, "gelu": 5, "gelu_tanh": 9}


def _per_element_flops(numel, fwd, mode):
    bwd = 2 * fwd + 1
    return numel * {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _unary_inputs(shape, dtype, device, seed):
    return (randn(shape, dtype, device, generator(device, seed)),)


def _unary_bytes(inputs, mode, **params):
    (x,) = inputs
    # fwd: read x, write y. bwd: read dy and x, write dx.
    return {"fwd": 2, "bwd": 3, "fwd+bwd": 5}[mode] * nbytes(x)


def _mask_bytes(numel):
    return -(-numel // 8)


def _relu_bytes(inputs, mode, **params):
    (x,) = inputs
    # fwd (no grad): read x, write y. With a backward to come, the forward also writes one bit
    # per element; bwd reads dy and those bits and writes dx.
    bits = _mask_bytes(x.numel())
    fwd, bwd = 2 * nbytes(x), 2 * nbytes(x) + bits
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bits + bwd}[mode]


def _unary_spec(name, impl, reference, description, act, baselines=None, bytes_fn=_unary_bytes):
    return register(
        OpSpec(
            name=name,
            family=FAMILY,
            impl=impl,
            reference=reference,
            make_inputs=_unary_inputs,
            shapes=UNARY_SHAPES,
            bytes=bytes_fn,
            flops=lambda inputs, mode, **params: _per_element_flops(
                inputs[0].numel(), ACT_FLOPS[act], mode
            ),
            baselines={**torch_baselines(reference), **(baselines or {})},
            description=description,
        )
    )


def _gelu_tanh(x):
    return tritonkit.gelu(x, approximate="tanh")


def _gelu_tanh_ref(x):
    return F.gelu(x, approximate="tanh")


_unary_spec(
    "relu",
    tritonkit.relu,
    torch.relu,
    "max(x, 0), NaN kept; saves 1 bit per element for backward",
    "relu",
    bytes_fn=_relu_bytes,
)
_unary_spec(
    "gelu",
    tritonkit.gelu,
    F.gelu,
    "GELU, exact (erf)",
    "gelu",
    {"cuda": cuda_gelu_baseline("none")},
)
_unary_spec(
    "gelu_tanh",
    _gelu_tanh,
    _gelu_tanh_ref,
    "GELU, tanh approximation",
    "gelu_tanh",
    {"cuda": cuda_gelu_baseline("tanh")},
)
_unary_spec("silu", tritonkit.silu, F.silu, "x * sigmoid(x)", "silu")


# A broadcast operand's gradient sums up to n_rows float32 terms: its absolute error grows with
# the sum of their magnitudes (about n_rows * 2**-24 each), not with the result, which can
# cancel to near zero. The test shapes sum at most 300 rows of O(1) terms.
ROW_SUM_GRAD_TOLERANCE = {**DEFAULT_TOLERANCES, torch.float32: Tolerance(atol=2e-5, rtol=1e-5)}


# ---- add --------------------------------------------------------------------------------------


def _add_inputs(shape, dtype, device, seed):
    x_shape, y_shape = shape
    gen = generator(device, seed)
    return randn(x_shape, dtype, device, gen), randn(y_shape, dtype, device, gen)


def _add_bytes(inputs, mode, **params):
    x, y = inputs
    out = x.numel() if x.numel() >= y.numel() else y.numel()
    out_bytes = out * x.element_size()
    small = x if x.numel() < y.numel() else y
    fwd = nbytes(x, y) + out_bytes
    # bwd: gradients pass through unchanged, except a broadcast operand's, which is the
    # upstream gradient summed over the broadcast dimensions (read it, write the sum).
    bwd = out_bytes + nbytes(small) if x.shape != y.shape else 0
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _add_bench_note(shape, mode):
    x_shape, y_shape = shape
    if mode == "bwd" and x_shape == y_shape:
        return "the gradient passes through to both inputs: no kernel runs (as in PyTorch)"
    return None


register(
    OpSpec(
        name="add",
        family=FAMILY,
        impl=tritonkit.add,
        reference=torch.add,
        make_inputs=_add_inputs,
        shapes=Shapes(
            test=[
                ((7,), (7,)),
                ((3, 129), (3, 129)),
                ((2, 5, 33), (33,)),
                ((2, 5, 33), (1, 5, 33)),
                ((33,), (4, 33)),
                ((5, 33), (1, 5, 33)),
                ((1000,), ()),
            ],
            bench=[((16384, 8192), (16384, 8192)), ((16384, 8192), (8192,))],
            empty=[((0, 5), (5,)), ((3, 0), (3, 0))],
            small=[((64, 3000), (64, 3000)), ((64, 3000), (3000,))],
        ),
        bytes=_add_bytes,
        flops=lambda inputs, mode, **params: (
            max(inputs[0].numel(), inputs[1].numel()) if mode != "bwd" else 0
        ),
        grad_tolerance=ROW_SUM_GRAD_TOLERANCE,
        baselines=torch_baselines(torch.add),
        bench_note=_add_bench_note,
        description="x + y, one operand broadcast over the other's leading dimensions",
    )
)


# ---- bias + activation --------------------------------------------------------------------


def _bias_act_inputs(shape, dtype, device, seed):
    gen = generator(device, seed)
    return randn(shape, dtype, device, gen), randn((shape[-1],), dtype, device, gen)


def _bias_act_bytes(inputs, mode, activation=None):
    x, bias = inputs
    # fwd: read x and bias, write y. bwd: read dy, x and bias, write dx and dbias; relu reads
    # its forward's bits (one per element) instead of x and bias.
    fwd = 2 * nbytes(x) + nbytes(bias)
    if activation == "relu":
        bits = _mask_bytes(x.numel())
        bwd = 2 * nbytes(x) + bits + nbytes(bias)
        fwd_train = fwd + bits
    else:
        bwd = 3 * nbytes(x) + 2 * nbytes(bias)
        fwd_train = fwd
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd_train + bwd}[mode]


_EAGER_ACT = {
    None: lambda z: z,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": _gelu_tanh_ref,
    "silu": F.silu,
}


def _bias_act_ref(x, bias, activation=None):
    return _EAGER_ACT[activation](x + bias)


register(
    OpSpec(
        name="bias_act",
        family=FAMILY,
        impl=tritonkit.bias_act,
        reference=_bias_act_ref,
        make_inputs=_bias_act_inputs,
        shapes=Shapes(
            test=[(7,), (3, 129), (2, 5, 33), (300, 7)],
            bench=[(16384, 8192)],
            empty=[(0, 5), (4, 0)],
            small=[(64, 3000)],
        ),
        params=(
            {"activation": "relu"},
            {"activation": None},
            {"activation": "gelu"},
            {"activation": "gelu_tanh"},
            {"activation": "silu"},
        ),
        bytes=_bias_act_bytes,
        flops=lambda inputs, mode, activation=None: _per_element_flops(
            inputs[0].numel(), 1 + ACT_FLOPS[activation], mode
        ),
        grad_tolerance=ROW_SUM_GRAD_TOLERANCE,
        baselines=torch_baselines(_bias_act_ref),
        description="act(x + bias), bias broadcast over rows; one pass instead of two",
    )
)


# ---- gated linear units -------------------------------------------------------------------


def _glu_inputs(shape, dtype, device, seed):
    gen = generator(device, seed)
    return randn(shape, dtype, device, gen), randn(shape, dtype, device, gen)


def _glu_bytes(inputs, mode, **params):
    gate, _ = inputs
    # fwd: read gate and up, write y. bwd: read dy, gate and up, write dgate and dup.
    return {"fwd": 3, "bwd": 5, "fwd+bwd": 8}[mode] * nbytes(gate)


def _swiglu_ref(gate, up):
    return F.silu(gate) * up


def _geglu_ref(gate, up, approximate="none"):
    return F.gelu(gate, approximate=approximate) * up


_GLU_SHAPES = Shapes(
    test=[(7,), (3, 129), (2, 5, 33)],
    bench=[(16384, 8192)],
    empty=[(0, 8)],
    small=[(64, 3000)],
)

register(
    OpSpec(
        name="swiglu",
        family=FAMILY,
        impl=tritonkit.swiglu,
        reference=_swiglu_ref,
        make_inputs=_glu_inputs,
        shapes=_GLU_SHAPES,
        bytes=_glu_bytes,
        flops=lambda inputs, mode, **params: _per_element_flops(
            inputs[0].numel(), 1 + ACT_FLOPS["silu"], mode
        ),
        baselines=torch_baselines(_swiglu_ref),
        description="silu(gate) * up",
    )
)

register(
    OpSpec(
        name="geglu",
        family=FAMILY,
        impl=tritonkit.geglu,
        reference=_geglu_ref,
        make_inputs=_glu_inputs,
        shapes=_GLU_SHAPES,
        params=({"approximate": "none"}, {"approximate": "tanh"}),
        bytes=_glu_bytes,
        flops=lambda inputs, mode, approximate="none": _per_element_flops(
            inputs[0].numel(), 1 + ACT_FLOPS["gelu" if approximate == "none" else "gelu_tanh"], mode
        ),
        baselines=torch_baselines(_geglu_ref),
        description="gelu(gate) * up",
    )
)
