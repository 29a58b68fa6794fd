"""A CUDA C++ GELU built with ``torch.utils.cpp_extension.load_inline``: the hand-written baseline.

The seeds compare GELU in CUDA, Triton and torch.compile; this is that CUDA kernel, one
element per thread as a first CUDA kernel is written, templated over float, half and
bfloat16, arithmetic in float. Forward only.
"""

import functools
import shutil
from collections.abc import Callable

import torch

from tritonkit.harness.spec import Baseline, Unavailable

_CPP = "torch::Tensor gelu(torch::Tensor x, bool tanh_approx);"

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

template <typename scalar_t, bool TANH>
__global__ void gelu_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                            int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float x = static_cast<float>(in[i]);
        float y = TANH
            ? 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)))
            : 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
        out[i] = static_cast<scalar_t>(y);
    }
}

torch::Tensor gelu(torch::Tensor x, bool tanh_approx) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n == 0) return y;
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "gelu", [&] {
        if (tanh_approx) {
            gelu_kernel<scalar_t, true><<<blocks, threads, 0, stream>>>(
                xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n);
        } else {
            gelu_kernel<scalar_t, false><<<blocks, threads, 0, stream>>>(
                xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n);
        }
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""


@functools.lru_cache(maxsize=1)
def _module():
    if not torch.cuda.is_available():
        raise Unavailable("needs a CUDA GPU")
    from torch.utils import cpp_extension

    if shutil.which("nvcc") is None and not cpp_extension.CUDA_HOME:
        raise Unavailable("nvcc (CUDA toolkit) not found")

    try:
        return cpp_extension.load_inline(
            name="tritonkit_cuda_gelu",
            cpp_sources=_CPP,
            cuda_sources=_CUDA,
            functions=["gelu"],
            extra_cuda_cflags=["-O3"],
            verbose=False,
        )
    except Exception as exc:  # a failed build is a missing baseline, not a crash
        raise Unavailable(f"CUDA build failed: {exc}") from exc


def cuda_gelu_baseline(approximate: str) -> Baseline:
    def build() -> Callable:
        module = _module()
        tanh = approximate == "tanh"
        return lambda x, **_: module.gelu(x, tanh)

    return Baseline(
        "cuda",
        build,
        backward=False,
        description="CUDA C++ kernel (load_inline), one element per thread",
    )
