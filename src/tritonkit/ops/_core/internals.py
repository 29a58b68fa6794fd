"""Every private PyTorch and Triton interface tritonkit uses, named once.

The public spellings exist for most of these, but each costs what a per-call path cannot
afford (``torch.backends.cuda.matmul.allow_tf32`` is a property that warns in recent PyTorch;
Triton's public launcher binds arguments in Python on every call). Each name below is read at
import; ``tests/test_plan.py`` checks every entry of :data:`NAMES` and fails naming the one an
upgrade of PyTorch or Triton moved.
"""

from __future__ import annotations

import os
from typing import Any

import torch

# name -> (owner module, attribute path): what the test resolves.
NAMES: dict[str, tuple[str, str]] = {
    "cublas_allow_tf32": ("torch._C", "_get_cublas_allow_tf32"),
    "cublas_allow_fp16_reduced": ("torch._C", "_get_cublas_allow_fp16_reduced_precision_reduction"),
    "cublas_allow_bf16_reduced": ("torch._C", "_get_cublas_allow_bf16_reduced_precision_reduction"),
    "cudnn_allow_tf32": ("torch._C", "_get_cudnn_allow_tf32"),
    "any_autocast": ("torch._C", "_is_any_autocast_enabled"),
    "dispatch_stack_len": ("torch._C", "_len_torch_dispatch_stack"),
    "functorch_stack": ("torch._C._functorch", "peek_interpreter_stack"),
    "after_autograd_keyset": ("torch._C", "_after_autograd_keyset"),
    "profiler_enabled": ("torch.autograd", "_profiler_enabled"),
    "dispatch_mode": ("torch.utils._python_dispatch", "TorchDispatchMode"),
    "triton_allocator": ("triton.runtime._allocation", "_allocator"),
    "triton_null_allocator": ("triton.runtime._allocation", "NullAllocator"),
    "environ_data": ("os", "environ._data"),
    "skip_dynamo_hook": ("torch.utils._python_dispatch", "TorchDispatchMode._should_skip_dynamo"),
    "extension_build_dir": ("torch.utils.cpp_extension", "_get_build_directory"),
    "environ_encodekey": ("os", "environ.encodekey"),
    "triton_driver": ("triton.runtime.driver", "DriverConfig.active"),
    # CompiledKernel._run: the launcher, None until _init_handles builds it
    "triton_compiled_launcher": ("triton.compiler.compiler", "CompiledKernel._init_handles"),
    "triton_cuda_launcher": ("triton.backends.nvidia.driver", "CudaLauncher"),
    "triton_cuda_driver": ("triton.backends.nvidia.driver", "CudaDriver"),
    "triton_key": ("triton.runtime.cache", "triton_key"),
    "triton_pack_args": ("triton.runtime.jit", "JITFunction._pack_args"),
    "triton_compute_cache_key": ("triton.runtime.jit", "compute_cache_key"),
    "triton_binder_factory": ("triton.runtime.jit", "create_function_from_signature"),
    # builds (or loads from Triton's cache) a C module: native_launch.c
    "triton_build_module": ("triton.runtime.build", "compile_module_from_src"),
}
# CUDA-only names: absent from a CPU build of PyTorch.
CUDA_NAMES: dict[str, tuple[str, str]] = {
    "cuda_device": ("torch._C", "_cuda_getDevice"),
    "cuda_raw_stream": ("torch._C", "_cuda_getCurrentRawStream"),
}


def resolve(owner: str, path: str) -> Any:
    import importlib

    obj: Any = importlib.import_module(owner)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


cublas_allow_tf32 = torch._C._get_cublas_allow_tf32
cublas_allow_fp16_reduced = torch._C._get_cublas_allow_fp16_reduced_precision_reduction
cublas_allow_bf16_reduced = torch._C._get_cublas_allow_bf16_reduced_precision_reduction
cudnn_allow_tf32 = torch._C._get_cudnn_allow_tf32
any_autocast = torch._C._is_any_autocast_enabled
dispatch_stack_len = torch._C._len_torch_dispatch_stack
functorch_stack = torch._C._functorch.peek_interpreter_stack
after_autograd_keyset = torch._C._after_autograd_keyset
profiler_enabled = torch.autograd._profiler_enabled
cuda_device = getattr(torch._C, "_cuda_getDevice", lambda: -1)
cuda_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


_ENVIRON_DATA = getattr(os.environ, "_data", None)
_ENCODE = getattr(os.environ, "encodekey", None)


def environ_get(name: str) -> str | None:
    """``os.environ.get(name)`` without its per-call encoding of the key and decoding of the
    value (a few microseconds, read on every call of every op): the environment mapping's own
    dict, looked up with the key encoded once per name."""
    if _ENVIRON_DATA is None or _ENCODE is None:
        return os.environ.get(name)
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = _ENCODE(name)
    value = _ENVIRON_DATA.get(key)
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


_ENCODED: dict[str, object] = {}


def dispatch_mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def triton_device_cache(jit_fn: Any, device: int) -> tuple[dict, dict, Any, Any]:
    """A JIT function's (compiled kernels by key, keys by specialization, target, backend) for
    ``device`` (its per-device cache; built by Triton on the function's first launch there)."""
    kernels, keys, target, backend, _ = jit_fn.device_caches[device]
    return kernels, keys, target, backend


def triton_binder(jit_fn: Any, device: int) -> Any:
    """Triton's generated argument binder of a JIT function for ``device`` (its per-device
    cache holds it at index 4; built by Triton on the function's first launch there)."""
    return jit_fn.device_caches[device][4]


def triton_driver() -> Any:
    """Triton's active driver (``triton.runtime.driver.active``)."""
    from triton.runtime.driver import driver

    return driver.active


def triton_driver_is_cuda() -> bool:
    """Whether Triton's active driver is its CUDA driver (whose launcher and utilities the
    direct path uses)."""
    from triton.backends.nvidia.driver import CudaDriver

    return isinstance(triton_driver(), CudaDriver)


def triton_launcher_built(compiled: Any) -> bool:
    """Whether a compiled kernel's C launcher is built and its module loaded (by Triton's
    own launch path, which builds them on a kernel's first launch)."""
    return getattr(compiled, "_run", None) is not None


def triton_allocator_unset() -> bool:
    """Whether no global-scratch allocator is set for Triton on this thread."""
    from triton.runtime import _allocation

    return isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
