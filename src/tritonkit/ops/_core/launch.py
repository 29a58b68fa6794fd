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
specialization) compiles it as Triton's launcher would (``JITFunction.warmup``: the same binder,
the same compile, nothing launched) and builds the entry; anything the direct path does not
handle goes through Triton's own launcher.

The first launches of a specialization need no C compiler (``early_launch.py``): until
Triton's C launcher for its signature is built, on a thread of its own, the entry launches
through the CUDA driver from Python with the same bytes.

The kernels of a call's first runs compile in parallel (``pipelined``): a launch that must
compile waits, in order, while its compile runs on a pool.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from tritonkit._tuning import WARMUP
from tritonkit._tuning import searching as _searching
from tritonkit.ops._core import early_launch, internals

try:  # host-side TMA descriptors (triton >= 3.3): bound like tensors (see Bound)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None

Grid = Sequence[int] | Callable[[dict[str, Any]], Sequence[int]]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


class _Entry:
    """One compiled specialization: what the launcher needs besides the grid and arguments."""

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

    def __init__(self, compiled: Any, device: int = -1) -> None:
        md = compiled.metadata
        self.metadata = compiled.packed_metadata
        self.coop = bool(getattr(md, "launch_cooperative_grid", False))
        self.pdl = bool(getattr(md, "launch_pdl", False))
        # Global scratch bytes per program (0: none), as CudaLauncher sizes it.
        self.scratch = getattr(md, "global_scratch_size", 0) * getattr(md, "num_ctas", 1)
        self.block = 32 * md.num_warps
        self.shared = md.shared
        # The parameter types in signature order ("constexpr", "*bf16", "i32", ...): how a
        # recording packs each argument.
        self.types = tuple(compiled.src.signature.values())
        if device < 0 or not early_launch.attach(compiled, self, device):
            runner = compiled.run  # the CudaLauncher: built (or loaded) and the module loaded
            self.launch = runner.launch
            self.function = compiled.function

    @staticmethod
    def direct(compiled: Any) -> bool:
        """Whether the direct call can stand in for Triton's launcher for this kernel."""
        md = compiled.metadata
        if getattr(md, "profile_scratch_size", 0) != 0 or getattr(md, "num_ctas", 1) != 1:
            return False
        return internals.triton_driver_is_cuda() or hasattr(compiled.run, "launch")

    def global_scratch(self, programs: int, device: int, stream: int) -> int | None:
        """Address of ``programs`` programs' global scratch, or None when the kernel has none."""
        if not self.scratch:
            return None
        return _scratch(programs * self.scratch, device, stream)


_KEY_PREFETCH: list[threading.Thread] = []


def _prefetch_triton_key() -> None:
    """Start computing Triton's own key (a hash of its compiler and of libtriton, hundreds of
    megabytes: tenths of a second, once per process, at the first compile or cache lookup) on
    a thread of its own when the first kernel is defined, so that the first call finds it
    done: the hash runs without the GIL while the process imports the rest."""
    if _KEY_PREFETCH:
        return
    from triton.runtime.cache import triton_key

    t = threading.Thread(target=triton_key, name="tritonkit-triton-key", daemon=True)
    _KEY_PREFETCH.append(t)
    t.start()


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
        if not self._interpret:
            _prefetch_triton_key()
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

    def binder(self, device: int) -> tuple[Callable, dict[Any, Any]]:
        """(Triton's generated binder for ``device``, this kernel's entries there); the binder
        is built now if Triton has not built it."""
        per_device = self._devices.get(device)
        if per_device is None:
            per_device = self._devices[device] = (internals.triton_binder(self.fn, device), {})
        return per_device

    def _launch(self, grid: Grid, args: tuple, meta: dict) -> tuple[_Entry | None, list | None]:
        """Launch; return the entry and the bound argument list where the direct path holds
        this specialization from now on (for ``Bound``), else (None, None)."""
        if WARMUP.session is not None:  # tritonkit.warmup: compile what this would, launch nothing
            WARMUP.session.launch(self, grid, args, meta)
            return None, None
        pipe = PIPE
        if self._interpret or not _DIRECT or self._hooked():
            if pipe.depth and pipe.every and _deferrable():  # tests: Triton's launch, deferred
                _defer(pipe, (self, grid, args, meta))
                return None, None
            if pipe.pending:  # a launch not deferred goes after those that were
                flush()
            self._triton(grid, args, meta)
            return None, None
        device = torch.cuda.current_device()
        binder, entries = self.binder(device)
        bound, spec, options = binder(*args, **meta)
        key = (*spec, *options.items())
        try:
            entry = entries.get(key)
        except TypeError:  # an unhashable constexpr: nothing to cache it by
            if pipe.pending:
                flush()
            self._triton(grid, args, meta)
            return None, None
        if pipe.depth and (entry is None or pipe.pending or pipe.every) and _deferrable():
            # A first call (launch.pipelined): compiles on the pool, the launch waits in order.
            source: Any = entry
            if entry is None:
                source = _compile_async(pipe, self, device, key, grid, args, meta)
            stream = torch.cuda.current_stream(device)
            _defer(pipe, (self, grid, args, meta, device, stream, key, bound, source))
            return None, None
        if pipe.pending:  # a launch not deferred goes after those that were
            flush()
        if entry is None:
            # Compiled (or loaded) as Triton's launcher would, nothing launched: the direct
            # launch below is the first (and a recording sees it).
            if _KEY_PREFETCH:  # not computed twice: wait for the thread that computes it
                _KEY_PREFETCH[0].join()
            compiled = self.fn.warmup(*args, grid=grid, **meta)
            if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
                compiled = compiled.result()
            ok = compiled is not None and _Entry.direct(compiled)
            entry = entries[key] = _Entry(compiled, device) if ok else _SLOW
        if entry is _SLOW:
            self._triton(grid, args, meta)
            return None, None
        if callable(grid):
            grid = grid(bound)
        values = list(bound.values())
        _direct(entry, grid, device, values)
        self.stats["direct"] += 1
        return entry, values


# ---- first calls: their kernels compile in parallel, their launches keep their order ---------

# Off unless TRITONKIT_PIPELINE=1, until the whole suite has passed on a GPU with it on: the
# first H100 run of the pipelined-launch tests failed for cross_entropy, linear and attention
# without tracebacks; a later one passed every op but linear, whose warm bound launches were
# not deferred (the tests now start from fresh plans).
_PIPELINE = os.environ.get("TRITONKIT_PIPELINE", "0") == "1"


class _Pipe(threading.local):
    """This thread's pipelined region (``pipelined``): its depth, the launches deferred in it
    (in order), the compiles in flight, and the dispatch mode that flushes before ATen ops."""

    depth = 0
    pending: list | None = None
    inflight: dict | None = None
    mode: Any = None
    misses = 0  # compiles started in the outermost region
    deferred = 0  # launches deferred on this thread, ever
    every = False  # tests: defer every launch in a region (the interpreter's too)


PIPE = _Pipe()


def pipelining(enabled: bool | None = None) -> bool:
    """Whether first calls compile their kernels in parallel; with ``enabled``, switch first."""
    global _PIPELINE
    if enabled is not None:
        _PIPELINE = bool(enabled)
    return _PIPELINE


class pipelined:
    """A region in which a launch that must compile first does not wait for it: its compile
    goes to a thread pool and the launch is deferred, with every launch after it, until an
    ATen op that touches memory (a dispatch mode flushes before it), a launch not deferred,
    or the end of the region (``flush``). So the kernels of one call compile in parallel
    and run in the order, on the streams and devices, they were launched in; the host enqueues
    nothing else in between (allocations and views excepted: they enqueue no work, and a
    deferred launch holds its tensors). Opened around a call's first runs (registry.apply, a
    first call's backward, an optimizer step); a no-op outside plain eager mode, while a
    recording or a tuner runs, and under the interpreter (tests defer there with
    ``PIPE.every``). ``misses``: the compiles started in the region, once it is closed."""

    __slots__ = ("misses", "opened")

    def __enter__(self) -> pipelined:
        pipe = PIPE
        self.opened = _PIPELINE and (
            pipe.depth > 0 or not (internals.dispatch_stack_len() or torch.compiler.is_compiling())
        )
        if self.opened:
            if pipe.depth == 0:
                pipe.misses = 0
            pipe.depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.opened:
            self.misses = 0
            return
        pipe = PIPE
        pipe.depth -= 1
        if pipe.depth:
            self.misses = pipe.misses
            return
        try:
            flush()
        finally:
            self.misses = pipe.misses
            mode, pipe.mode = pipe.mode, None
            if mode is not None:
                mode.__exit__(None, None, None)


_COMPILER: list[Any] = []  # the pool that compiles deferred launches' kernels, once made


def _compile_pool() -> Any:
    if not _COMPILER:
        from concurrent.futures import ThreadPoolExecutor

        workers = max(1, min(16, os.cpu_count() or 1))
        _COMPILER.append(ThreadPoolExecutor(workers, "tritonkit-compile"))
    return _COMPILER[0]


def _compile(fn: Any, device: int, grid: Grid, args: tuple, meta: dict) -> Any:
    """What Kernel._launch's miss does before launching, on a pool thread: compile (or load)
    the specialization ``args`` give, launching nothing."""
    if _KEY_PREFETCH:
        _KEY_PREFETCH[0].join()
    with torch.cuda.device(device):
        compiled = fn.warmup(*args, grid=grid, **meta)
    return compiled.result() if hasattr(compiled, "result") else compiled


def _deferrable() -> bool:
    """Whether a launch in a region may wait: not while a recording or a tuner runs (they
    must see, and time, the launch where it is made)."""
    return RECORDER.rec is None and not _searching()


def _compile_async(pipe: _Pipe, kernel: Kernel, device: int, key: Any, grid: Grid, args: tuple,
                   meta: dict) -> Any:  # fmt: skip
    """The compile of a specialization, on the pool (once per region and key)."""
    if pipe.inflight is None:
        pipe.inflight = {}
    ident = (id(kernel), device, key)
    future = pipe.inflight.get(ident)
    if future is None:
        future = pipe.inflight[ident] = _compile_pool().submit(
            _compile, kernel.fn, device, grid, args, meta
        )
        pipe.misses += 1
    return future


def _defer(pipe: _Pipe, item: tuple) -> None:
    """Queue a launch behind this thread's deferred ones; the dispatch mode that flushes them
    before an ATen op is pushed with the first."""
    if pipe.mode is None:
        pipe.mode = _FlushMode()
        pipe.mode.__enter__()
    if pipe.pending is None:
        pipe.pending = []
    pipe.pending.append(item)
    pipe.deferred += 1


def flush() -> None:
    """Launch this thread's deferred launches, in order (each waiting for its compile)."""
    pipe = PIPE
    items, pipe.pending = pipe.pending, None
    if pipe.inflight:
        pipe.inflight = None
    for item in items or ():
        if len(item) == 4:
            kernel, grid, args, meta = item
            kernel._triton(grid, args, meta)
            continue
        kernel, grid, args, meta, device, stream, key, bound, source = item
        entries = kernel.binder(device)[1]
        entry = entries.get(key)
        if entry is None:
            compiled = source.result()
            ok = compiled is not None and _Entry.direct(compiled)
            entry = entries[key] = _Entry(compiled, device) if ok else _SLOW
        if entry is _SLOW:
            with torch.cuda.device(device), torch.cuda.stream(stream):
                kernel._triton(grid, args, meta)
            continue
        values = list(bound.values())
        _direct(entry, grid(bound) if callable(grid) else grid, device, values, stream.cuda_stream)
        kernel.stats["direct"] += 1


# ATen ops that enqueue no work: a deferred launch need not go before them.
_NO_FLUSH = {
    "empty",
    "empty_strided",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "detach",
    "alias",
    "lift_fresh",
    "_unsafe_view",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_contiguous",
    "is_same_size",
}


class _FlushMode(internals.dispatch_mode_class()):
    """Pushed while a region holds deferred launches: they go before any ATen op but
    allocations and views."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # as recording.py's mode: plain eager only
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if PIPE.pending and not func.is_view and func.overloadpacket.__name__ not in _NO_FLUSH:
            flush()
        return func(*args, **(kwargs or {}))


def pipelined_class(function: type) -> type:
    """``function`` (an autograd.Function) with its backward run in a ``pipelined`` region,
    under the same name (its nodes are named alike)."""
    cached = function.__dict__.get("_tk_pipelined")
    if cached is not None:
        return cached

    def backward(ctx, *grads):
        with pipelined():
            return function.backward(ctx, *grads)

    # Named at creation: autograd names the node class after it (NormFunctionBackward).
    cls = type(function.__name__, (function,), {"backward": staticmethod(backward)})
    cls.__qualname__ = function.__qualname__
    function._tk_pipelined = cls
    return cls


def _direct(
    entry: _Entry, grid: Sequence[int], device: int, values: list, stream: int | None = None
) -> None:
    """One call of the compiled launcher (the C launcher that Triton's own launcher ends in),
    on the current stream or ``stream``."""
    n = len(grid)
    g0, g1, g2 = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
    rec = RECORDER.rec
    if rec is not None:
        rec.launch(entry, (g0, g1, g2), values)
    if stream is None:
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
        # Not while launches are deferred (launch.pipelined): Kernel._launch keeps the order.
        if (
            entry is not None
            and WARMUP.session is None
            and not PIPE.pending
            and not self.kernel._hooked()
        ):
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


@dataclass(frozen=True)
class Launch:
    """One kernel launch with everything but its tensors fixed: the grid, the scalar arguments
    after the tensors (sizes, strides, eps, ...), the constexprs and ``num_warps``.
    ``launch(*tensors)`` launches on the current stream."""

    kernel: Kernel
    grid: tuple[int, ...]
    scalars: tuple[int | float, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, *tensors: Any) -> None:
        self.kernel.launch(self.grid, *tensors, *self.scalars, **self.meta)
