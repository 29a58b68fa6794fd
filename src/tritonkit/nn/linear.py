"""Linear module: drop-in for torch.nn.Linear, with an optional fused activation and residual."""

import torch
from torch import nn

from tritonkit.ops._core.validate import check_choice
from tritonkit.ops.matmul import linear

_ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")


class Linear(nn.Linear):
    """``torch.nn.Linear`` on tritonkit's GEMM, with the activation fused into its epilogue.

    The parameters, their initialisation and the state_dict keys (``weight``, ``bias``) are
    torch.nn.Linear's, so a torch.nn.Linear checkpoint loads as is (``load_state_dict``), and
    ``Linear.from_linear`` wraps an existing module's parameters without a copy.

    Args:
        in_features: size of each input sample.
        out_features: size of each output sample.
        bias: whether to learn an additive bias.
        activation: None, ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``, applied
            after the bias in the GEMM's epilogue.
        device: where to create the parameters.
        dtype: dtype of the parameters.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        activation: str | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        check_choice("tritonkit.nn.Linear", "activation", activation, _ACTIVATIONS)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.activation = activation

    @classmethod
    def from_linear(cls, module: nn.Linear, activation: str | None = None) -> "Linear":
        """A tritonkit Linear sharing ``module``'s parameters (no copy).

        Args:
            module: the torch.nn.Linear to wrap.
            activation: the activation to fuse, as in the constructor.
        """
        out = cls(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            activation=activation,
            device="meta",
        )
        out.weight = module.weight
        out.bias = module.bias
        return out

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``act(x @ weight^T + bias) + residual``.

        Args:
            x: input of shape ``(..., in_features)``.
            residual: optional tensor of the output's shape, added after the activation.
        """
        return linear(x, self.weight, self.bias, self.activation, residual)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}"
