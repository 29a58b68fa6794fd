"""``torch.nn`` modules backed by tritonkit kernels."""

from tritonkit.nn.activation import GELU, ReLU, SiLU
from tritonkit.nn.attention import SdpaPatchReport, sdpa_patch
from tritonkit.nn.conv import Conv2d, convert_conv2d, fuse_conv_bn
from tritonkit.nn.linear import Linear
from tritonkit.nn.loss import CrossEntropyLoss
from tritonkit.nn.norm import LayerNorm, RMSNorm
from tritonkit.nn.quantized import Float8Linear as Float8Linear
from tritonkit.nn.quantized import Int8Linear as Int8Linear
from tritonkit.nn.softmax import LogSoftmax, Softmax

__all__ = [
    "GELU",
    "Conv2d",
    "CrossEntropyLoss",
    "LayerNorm",
    "Linear",
    "LogSoftmax",
    "RMSNorm",
    "ReLU",
    "SdpaPatchReport",
    "SiLU",
    "Softmax",
    "convert_conv2d",
    "fuse_conv_bn",
    "sdpa_patch",
]
