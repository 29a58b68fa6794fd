"""Quantization kernels: quantize (amax, scale and saturating cast fused) to int8, int4 and
float8 at every granularity, dequantize, the delayed-scaling update and the weight-only int8
GEMM. The public API is ``tritonkit.quant``."""
