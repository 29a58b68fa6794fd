"""``torch.nn`` modules backed by tritonkit kernels."""

from tritonkit.nn.activation import GELU, ReLU, SiLU
from tritonkit.nn.linear import Linear

__all__ = ["GELU", "Linear", "ReLU", "SiLU"]
