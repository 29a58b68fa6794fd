"""The launch path every tritonkit kernel takes: Triton's JIT once per specialization, then a
direct call of the compiled launcher.

``kernel[grid](*args, **meta)`` on a ``triton.jit`` function runs Triton's generic launcher
on every call: it binds the arguments, builds a specialization key as a string, looks it up,
checks the kernel's globals, wraps launch metadata for hooks and calls a Python shim around the
C launcher: tens of microseconds for an empty kernel, more than most row kernels take on the
GPU (docs/performance.md), and the autograd engine's device thread runs that Python slower
again.

``@kernel`` wraps a ``triton.jit`` function so that the same ``k[grid](*args, **meta)`` call
does less: Triton's own generated binder (C code per argument) gives the specialization
(dtypes, 16-byte alignment of pointers, integers equal to 1 or divisible by 16, constexpr
values), which keys a per-device dict of ``_Entry``; an entry holds the compiled launcher, the
CUfunction and the packed metadata, and calling it is one C call. A miss (first call of a
specialization, or anything the direct path does not handle) goes through Triton's own
launcher, which compiles, launches and returns the compiled kernel that the entry is built
from, so the first call of every specialization behaves exactly as Triton's.

Kernels that need global scratch memory (tensor descriptors made on the device,
``tl.make_tensor_descriptor``) take the direct path too: the entry allocates the scratch as
Triton's CudaLauncher does (bytes per program times programs), from a buffer kept per device
and stream. Left to Triton's launcher, every call: the CPU interpreter
(``TRITON_INTERPRET=1``), launch hooks (Proton and other profilers register them), and kernels
that need profile scratch memory.

``Kernel.bind`` goes one step further for launchers that cache a plan per shape: the binder
runs once, and later calls substitute new tensors of the same dtypes and alignment into the
bound arguments (``Bound``).

Both paths also tell a recording (``replay.py``) what they launch: the CUfunction, grid, block,
shared memory and each parameter as the compiled kernel takes it, so that a later call with the
same metadata can be replayed from C++ without Python.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton

from tritonkit.ops._core import internals

try:  # host-side TMA descriptors (triton >= 3.3): bound like tensors (see Bound)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None

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
        # Global scratch bytes per program (0: none), as CudaLauncher sizes it.
        self.scratch = getattr(runner, "global_scratch_size", 0) * getattr(runner, "num_ctas", 1)
        self.block = 32 * compiled.metadata.num_warps
        self.shared = compiled.metadata.shared
        # The parameter types in signature order ("constexpr", "*bf16", "i32", ...): how a
        # recording packs each argument.
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

    def global_scratch(self, programs: int, device: int, stream: int) -> int | None:
        """Address of ``programs`` programs' global scratch, or None when the kernel has none."""
        if not self.scratch:
            return None
        return _scratch(programs * self.scratch, device, stream)


# (device, stream) -> a uint8 buffer. Kernels on one stream run one after another, so every
# launch on it can take the same buffer; another stream gets its own.
_SCRATCH: dict[tuple[int, int], torch.Tensor] = {}


def _scratch(nbytes: int, device: int, stream: int) -> int:
    buf = _SCRATCH.get((device, stream))
    if buf is None or buf.numel() < nbytes:
        buf = torch.empty(max(nbytes, 1 << 16), dtype=torch.uint8, device=f"cuda:{device}")
        _SCRATCH[(device, stream)] = buf
    return buf.data_ptr()


def _torch_allocator(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.uint8, device="cuda")


def _ensure_allocator() -> None:
    """Give Triton's launcher an allocator for global scratch if nobody has set one: it is a
    context variable, unset on every new thread (the autograd engine's among them)."""
    if internals.triton_allocator_unset():
        triton.set_allocator(_torch_allocator)


_SLOW = object()  # cached for a specialization that must keep Triton's launcher

# The direct path is on unless TRITONKIT_DIRECT_LAUNCH=0; ``direct_launch`` switches it at run
# time (measurements compare the two paths in one process).
_DIRECT = os.environ.get("TRITONKIT_DIRECT_LAUNCH", "1") != "0"


class _Recorder(threading.local):
    """The recording this thread's launches go to (replay.py sets it while it records), or
    None: per thread, so that another thread's launches never land in a recording."""

    rec: Any = None


RECORDER = _Recorder()


def direct_launch(enabled: bool | None = None) -> bool:
    """Whether launches take the direct path; with ``enabled``, switch it first."""
    global _DIRECT
    if enabled is not None:
        _DIRECT = bool(enabled)
    return _DIRECT


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
        # Launches by path: bound (Bound's call), direct (Kernel.launch's), Triton's launcher.
        self.stats = {"bound": 0, "direct": 0, "triton": 0}

    def __getattr__(self, name: str) -> Any:  # warmup, cache, src, ...: the JIT function's
        return getattr(self.__dict__["fn"], name)

    def __getitem__(self, grid: Grid) -> Callable[..., None]:
        return lambda *args, **meta: self.launch(grid, *args, **meta)

    def _triton(self, grid: Grid, args: tuple, meta: dict) -> Any:
        self.stats["triton"] += 1
        rec = RECORDER.rec
        if rec is not None:
            rec.fail(f"{self.__name__} launched through Triton's launcher")
        if not self._interpret:
            _ensure_allocator()
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
        self._launch(grid, args, meta)

    def bind(self, grid: Sequence[int], *args: Any, **meta: Any) -> Bound:
        """``Bound`` launches of this kernel: ``grid``, the non-tensor arguments and ``meta``
        fixed, the tensors (and host TMA descriptors) given at each call, in the order of
        ``args``. Nothing is launched here; ``args``' tensors only say where tensors go."""
        return Bound(self, grid, args, meta)

    def _launch(self, grid: Grid, args: tuple, meta: dict) -> tuple[_Entry | None, list | None]:
        """Launch; return the entry and the bound argument list where the direct path holds
        this specialization from now on (for ``Bound``), else (None, None)."""
        if self._interpret or not _DIRECT or self._hooked():
            self._triton(grid, args, meta)
            return None, None
        device = torch.cuda.current_device()
        per_device = self._devices.get(device)
        if per_device is None:
            # Triton's generated binder for this device's backend (built now if Triton has not).
            per_device = self._devices[device] = (internals.triton_binder(self.fn, device), {})
        binder, entries = per_device
        bound, spec, options = binder(*args, **meta)
        key = (*spec, *options.items())
        try:
            entry = entries.get(key)
        except TypeError:  # an unhashable constexpr: nothing to cache it by
            self._triton(grid, args, meta)
            return None, None
        if entry is None:
            recording = RECORDER.rec is not None
            if recording:  # compile without launching; the direct launch below is recorded
                compiled = self.fn.warmup(*args, grid=grid, **meta)
            else:
                compiled = self._triton(grid, args, meta)
            if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
                compiled = compiled.result()
            ok = compiled is not None and _Entry.direct(compiled)
            entry = entries[key] = _Entry(compiled) if ok else _SLOW
            if not recording:
                return (entry, list(bound.values())) if ok else (None, None)
        if entry is _SLOW:
            self._triton(grid, args, meta)
            return None, None
        if callable(grid):
            grid = grid(bound)
        values = list(bound.values())
        _direct(entry, grid, device, values)
        self.stats["direct"] += 1
        return entry, values


def _direct(entry: _Entry, grid: Sequence[int], device: int, values: list) -> None:
    """One call of the compiled launcher (the C launcher that Triton's own launcher ends in)."""
    n = len(grid)
    g0, g1, g2 = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
    rec = RECORDER.rec
    if rec is not None:
        rec.launch(entry, (g0, g1, g2), values)
    stream = internals.cuda_raw_stream(device)
    entry.launch(
        g0,
        g1,
        g2,
        stream,
        entry.function,
        entry.coop,
        entry.pdl,
        entry.global_scratch(g0 * g1 * g2, device, stream),
        None,  # profile scratch: none (see _Entry.direct)
        entry.metadata,
        None,  # launch metadata: only launch hooks read it, and none is set
        None,
        None,
        *values,
    )


def _bindable(a: object) -> bool:
    return isinstance(a, torch.Tensor) or (
        TensorDescriptor is not None and isinstance(a, TensorDescriptor)
    )


class Bound:
    """A kernel launch whose grid, scalars and constexprs are fixed and whose tensors change:
    what a launcher's cached plan holds for each kernel it launches.

    ``Kernel.launch`` runs Triton's binder on every call (a specialization of every argument:
    pointer alignment, integer divisibility, constexpr values) to find the compiled kernel.
    A plan cached per shapes, strides and dtypes knows all of that but the tensors: the first
    call resolves the entry and the bound argument list, and every later call puts its tensors
    into a copy of that list and calls the C launcher. A tensor of another dtype or 16-byte
    alignment than the first call's, another current device, launch hooks or the interpreter
    take ``Kernel.launch`` instead, which is always right. No tensor is kept between calls.
    """

    __slots__ = ("_aligned", "_args", "_device", "_dtypes", "_entry", "_values", "grid", "kernel")
    __slots__ += ("meta", "slots")

    def __init__(self, kernel: Kernel, grid: Sequence[int], args: Sequence[Any], meta: dict):
        self.kernel, self.grid, self.meta = kernel, tuple(grid), meta
        self.slots = tuple(i for i, a in enumerate(args) if _bindable(a))
        self._args = [None if i in self.slots else a for i, a in enumerate(args)]
        self._entry: _Entry | None = None
        self._values: list | None = None
        self._device = -1
        self._dtypes: tuple = ()
        self._aligned: tuple = ()

    def __call__(self, *tensors: Any) -> None:
        """Launch with ``tensors`` in the slots of the tensors given to ``Kernel.bind``."""
        entry = self._entry
        if entry is not None and not self.kernel._hooked():
            device = torch.cuda.current_device()
            if device == self._device and _DIRECT and self._same_kind(tensors):
                values = self._values.copy()
                for i, t in zip(self.slots, tensors):
                    values[i] = t
                _direct(entry, self.grid, device, values)
                self.kernel.stats["bound"] += 1
                return
        args = self._args.copy()
        for i, t in zip(self.slots, tensors):
            args[i] = t
        entry, values = self.kernel._launch(self.grid, tuple(args), self.meta)
        if entry is not None and self._entry is None:  # the first resolution is the plan's
            for i in self.slots:
                values[i] = None  # no tensor outlives the call
            self._entry, self._values = entry, values
            self._device = torch.cuda.current_device()
            self._dtypes, self._aligned = _kinds(tensors)

    def _same_kind(self, tensors: Sequence[Any]) -> bool:
        return _kinds(tensors) == (self._dtypes, self._aligned)


def _kinds(tensors: Sequence[Any]) -> tuple[tuple, tuple]:
    """What Triton specializes a pointer on: its dtype and whether it is 16-byte aligned."""
    dtypes = tuple(getattr(t, "dtype", None) for t in tensors)
    aligned = tuple(
        t.data_ptr() % 16 == 0 if isinstance(t, torch.Tensor) else True for t in tensors
    )
    return dtypes, aligned


def kernel(fn: Callable | None = None, **jit_options: Any) -> Any:
    """Decorator: ``@kernel`` (or ``@kernel(do_not_specialize=...)``) in place of ``@triton.jit``
    on a kernel that launchers launch. Helpers called from kernels stay ``@triton.jit``."""

    def wrap(f: Callable) -> Kernel:
        return Kernel(triton.jit(f, **jit_options) if jit_options else triton.jit(f))

    return wrap(fn) if fn is not None else wrap
