"""Activation modules: drop-in for torch.nn.ReLU, GELU and SiLU."""

import torch
from torch import nn

from tritonkit.ops.elementwise import gelu, relu, silu


def _check_not_inplace(module: str, inplace: bool) -> None:
    if inplace:
        raise ValueError(f"tritonkit.nn.{module}: inplace=True is not supported, got inplace=True")


class ReLU(nn.Module):
    """``torch.nn.ReLU`` on tritonkit's kernel (out of place only)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        _check_not_inplace("ReLU", inplace)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu(x)


class GELU(nn.Module):
    """``torch.nn.GELU`` on tritonkit's kernel.

    Args:
        approximate: ``"none"`` (erf) or ``"tanh"``.
    """

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(
                f"tritonkit.nn.GELU: approximate must be 'none' or 'tanh', got {approximate!r}"
            )
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(nn.Module):
    """``torch.nn.SiLU`` on tritonkit's kernel (out of place only)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        _check_not_inplace("SiLU", inplace)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu(x)
