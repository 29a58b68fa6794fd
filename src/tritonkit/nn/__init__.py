"""``torch.nn`` modules backed by tritonkit kernels."""

from tritonkit.nn.activation import GELU, ReLU, SiLU

__all__ = ["GELU", "ReLU", "SiLU"]
