"""The launch path every tritonkit kernel takes: Triton's JIT once per specialization, then a
direct call of the compiled launcher.

``kernel[grid](*args, **meta)`` on a ``triton.jit`` function runs Triton's generic launcher
on every call: it binds the arguments, builds a specialization key as a string, looks it up,
checks the kernel's globals, wraps launch metadata for hooks and calls a Python shim around the
C launcher: 14 us for an empty 4-argument kernel and 28 us for a 30-argument one on the H100
host (docs/performance.md, "host time per launch"), more than most row kernels take on the
GPU.

``@kernel`` wraps a ``triton.jit`` function so that the same ``k[grid](*args, **meta)`` call
does less: Triton's own generated binder (C code per argument) gives the specialization
(dtypes, 16-byte alignment of pointers, integers equal to 1 or divisible by 16, constexpr
values), which keys a per-device dict of ``_Entry``; an entry holds the compiled launcher, the
CUfunction and the packed metadata, and calling it is one C call. A miss (first call of a
specialization) goes through Triton's own launcher, which compiles, launches and returns the
compiled kernel that the entry is built from, so the first call of every specialization
behaves exactly as Triton's.

Left to Triton's launcher, every call: the CPU interpreter (``TRITON_INTERPRET=1``), launch
hooks (Proton and other profilers register them), multi-CTA clusters and profile scratch.

The direct path also tells a recording (``replay.py``) what it launched: the CUfunction, grid,
block, shared memory and each parameter as the compiled kernel takes it, so that a later call
with the same metadata can be replayed without Python.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton

Grid = Sequence[int] | Callable[[dict[str, Any]], Sequence[int]]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


class _Entry:
    """One compiled specialization: what the C launcher needs besides the grid and arguments."""

    __slots__ = (
        "block",
        "coop",
        "function",
        "launch",
        "metadata",
        "pdl",
        "scratch",
        "shared",
        "types",
    )

    def __init__(self, compiled: Any) -> None:
        runner = compiled.run  # the CudaLauncher; loads the module on first access
        self.launch = runner.launch
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.coop = runner.launch_cooperative_grid
        self.pdl = runner.launch_pdl
        self.scratch = getattr(runner, "global_scratch_size", 0)
        self.block = 32 * compiled.metadata.num_warps
        self.shared = compiled.metadata.shared
        # The parameter types in signature order ("constexpr", "*bf16", "i32", ...).
        self.types = tuple(compiled.src.signature.values())

    @staticmethod
    def direct(compiled: Any) -> bool:
        """Whether the direct call can stand in for Triton's launcher for this kernel."""
        runner = compiled.run
        return (
            getattr(runner, "profile_scratch_size", 0) == 0
            and hasattr(runner, "launch")
            and getattr(runner, "num_ctas", 1) == 1
        )


_SLOW = object()  # cached for a specialization that must keep Triton's launcher

# The direct path is on unless TRITONKIT_DIRECT_LAUNCH=0; ``direct_launch`` switches it at run
# time (measurements compare the two paths in one process).
_DIRECT = os.environ.get("TRITONKIT_DIRECT_LAUNCH", "1") != "0"

# A recording in progress (replay.py sets it on the thread that records), or None.
RECORDER: Any = None


def direct_launch(enabled: bool | None = None) -> bool:
    """Whether launches take the direct path; with ``enabled``, switch it first."""
    global _DIRECT
    if enabled is not None:
        _DIRECT = bool(enabled)
    return _DIRECT


def _scratch(entry: _Entry, grid: tuple[int, int, int], device: int) -> torch.Tensor:
    """Global scratch for a kernel that asks for it (device-side TMA descriptors, say), sized as
    Triton's launcher sizes it. It comes from PyTorch's caching allocator (512-byte aligned)
    rather than ``triton.set_allocator``'s, which is a context variable: unset on the autograd
    engine's threads, where backward kernels launch."""
    size = entry.scratch * grid[0] * grid[1] * grid[2]
    return torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", device))


class Kernel:
    """A ``triton.jit`` function launched as ``k[grid](*args, **meta)``, with the direct path.

    The arguments, grid and keyword meta-parameters (constexprs, ``num_warps``,
    ``num_stages``, ...) are Triton's; so is everything computed (the same compiled kernel).
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)
        self._interpret = _interpreting() or not isinstance(fn, triton.runtime.JITFunction)
        # device index -> (Triton's binder for it, specialization key -> _Entry or _SLOW)
        self._devices: dict[int, tuple[Callable, dict[Any, Any]]] = {}

    def __getattr__(self, name: str) -> Any:  # warmup, cache, src, ...: the JIT function's
        return getattr(self.__dict__["fn"], name)

    def __getitem__(self, grid: Grid) -> Callable[..., None]:
        return lambda *args, **meta: self.launch(grid, *args, **meta)

    def _triton(self, grid: Grid, args: tuple, meta: dict) -> Any:
        if RECORDER is not None:
            RECORDER.fail(f"{self.__name__} launched through Triton's launcher")
        return self.fn[grid](*args, **meta)

    def _hooked(self) -> bool:
        runtime = triton.knobs.runtime
        return bool(
            self.fn.pre_run_hooks
            or getattr(runtime.launch_enter_hook, "calls", runtime.launch_enter_hook)
            or getattr(runtime.launch_exit_hook, "calls", runtime.launch_exit_hook)
        )

    def launch(self, grid: Grid, *args: Any, **meta: Any) -> None:
        """Launch on the current device and stream, as ``fn[grid](*args, **meta)`` does."""
        if self._interpret or not _DIRECT or self._hooked():
            self._triton(grid, args, meta)
            return
        device = torch.cuda.current_device()
        per_device = self._devices.get(device)
        if per_device is None:
            # Triton's generated binder for this device's backend (built now if Triton has not).
            per_device = self._devices[device] = (self.fn.device_caches[device][4], {})
        binder, entries = per_device
        bound, spec, options = binder(*args, **meta)
        key = (*spec, *options.items())
        try:
            entry = entries.get(key)
        except TypeError:  # an unhashable constexpr: nothing to cache it by
            self._triton(grid, args, meta)
            return
        if entry is None:
            recorder = RECORDER
            compiled = self._triton(grid, args, meta) if recorder is None else None
            if compiled is None:  # recording: compile without launching, then launch below
                compiled = self.fn.warmup(*args, grid=grid, **meta)
            if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
                compiled = compiled.result()
            ok = compiled is not None and _Entry.direct(compiled)
            entry = entries[key] = _Entry(compiled) if ok else _SLOW
            if recorder is None:
                return
        if entry is _SLOW:
            self._triton(grid, args, meta)
            return
        if callable(grid):
            grid = grid(bound)
        n = len(grid)
        grid = (grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1)
        stream = torch._C._cuda_getCurrentRawStream(device)
        scratch = _scratch(entry, grid, device) if entry.scratch else None
        if RECORDER is not None:
            RECORDER.launch(entry, grid, tuple(bound.values()), scratch)
        entry.launch(
            grid[0],
            grid[1],
            grid[2],
            stream,
            entry.function,
            entry.coop,
            entry.pdl,
            scratch,
            None,  # profile scratch: none (see _Entry.direct)
            entry.metadata,
            None,  # launch metadata: only launch hooks read it, and none is set
            None,
            None,
            *bound.values(),
        )


def kernel(fn: Callable | None = None, **jit_options: Any) -> Any:
    """Decorator: ``@kernel`` (or ``@kernel(do_not_specialize=...)``) in place of ``@triton.jit``
    on a kernel that launchers launch. Helpers called from kernels stay ``@triton.jit``."""

    def wrap(f: Callable) -> Kernel:
        return Kernel(triton.jit(f, **jit_options) if jit_options else triton.jit(f))

    return wrap(fn) if fn is not None else wrap
