"""2-D convolution: implicit GEMM on the tensor cores, forward and backward, with fused
bias / activation / residual epilogues.

``kernels.py``: the ``@triton.jit`` kernels (implicit-GEMM forward, 1x1 GEMM, depthwise,
dgrad, wgrad, backward helpers); ``config.py``: a frozen config per kernel path with its
heuristic and tuning candidates; ``plan.py``: the launchers; ``function.py``: the
torch.library ops, the autograd Function and the public ``conv2d``.
"""

from tritonkit.ops.conv.config import ConvProblem, DepthwiseConfig, GemmConfig, WgradConfig
from tritonkit.ops.conv.function import ConvArgumentError, ConvFunction, conv2d

__all__ = ["conv2d"]
