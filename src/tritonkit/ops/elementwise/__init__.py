"""Elementwise family: activations, the broadcast bias + activation operator, add, and GLUs.

Launchers: ``bias_act_fwd`` / ``bias_act_bwd`` (the shared pointwise tiles of
``_core.pointwise``, configured by ``_core.pointwise_config.PointwiseConfig``) and
``glu_fwd`` / ``glu_bwd`` (``plan.py``).
"""

from tritonkit.ops._core.bias_act import bias_act_bwd, bias_act_fwd
from tritonkit.ops.elementwise.function import (
    BiasActFunction,
    GLUFunction,
    add,
    bias_act,
    geglu,
    gelu,
    relu,
    silu,
    swiglu,
)
from tritonkit.ops.elementwise.plan import glu_bwd, glu_fwd

__all__ = ["add", "bias_act", "geglu", "gelu", "relu", "silu", "swiglu"]
