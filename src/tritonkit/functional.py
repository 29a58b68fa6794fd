"""The public functions of tritonkit, one import away: ``from tritonkit.functional import gelu``."""

from tritonkit.ops.attention import attention, attention_varlen
from tritonkit.ops.cross_entropy import cross_entropy
from tritonkit.ops.elementwise import add, bias_act, geglu, gelu, relu, silu, swiglu
from tritonkit.ops.matmul import int8_matmul, linear, matmul, scaled_matmul
from tritonkit.ops.memory import copy, transpose
from tritonkit.ops.norm import add_layer_norm, add_rms_norm, layer_norm, rms_norm
from tritonkit.ops.softmax import log_softmax, softmax

__all__ = [
    "add",
    "add_layer_norm",
    "add_rms_norm",
    "attention",
    "attention_varlen",
    "bias_act",
    "copy",
    "cross_entropy",
    "geglu",
    "gelu",
    "int8_matmul",
    "layer_norm",
    "linear",
    "log_softmax",
    "matmul",
    "relu",
    "rms_norm",
    "scaled_matmul",
    "silu",
    "softmax",
    "swiglu",
    "transpose",
]
