"""The public functions of tritonkit, one import away: ``from tritonkit.functional import gelu``."""

from tritonkit.ops.elementwise import add, bias_act, geglu, gelu, relu, silu, swiglu
from tritonkit.ops.matmul import int8_matmul, linear, matmul, scaled_matmul
from tritonkit.ops.memory import copy, transpose

__all__ = [
    "add",
    "bias_act",
    "copy",
    "geglu",
    "gelu",
    "int8_matmul",
    "linear",
    "matmul",
    "relu",
    "scaled_matmul",
    "silu",
    "swiglu",
    "transpose",
]
