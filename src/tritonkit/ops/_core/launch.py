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

The first launches of a specialization need no C compiler. Triton's C launcher is generated
per kernel signature and built with the system's C compiler (a third of a second or more,
once per signature, on the first call of every specialization a Triton cache has not seen:
in a process from empty caches most of the time its first calls take, beside compiling the
kernels). Until it is built, a kernel whose parameters are pointers, integers and floats
(not tuples or tensor descriptors; no cooperative grid, no PDL, one CTA) is launched through
the CUDA driver from Python (``_EarlyLaunch``: the same CUfunction, grid, block, shared
memory and parameter bytes as the C launcher passes, with ``ctypes``), while the C launcher is
built on a thread of its own (``_LauncherBuilds``) and replaces it when ready.

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

import atexit
import ctypes
import os
import queue
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from tritonkit._tuning import searching as _searching
from tritonkit.ops._core import internals

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
        if device < 0 or not _early(compiled, self, device):
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


# ---- the first launches of a specialization: no C compiler on the way -------------------------

# The early path is on unless TRITONKIT_EARLY_LAUNCH=0 (measurements compare the two).
_EARLY = os.environ.get("TRITONKIT_EARLY_LAUNCH", "1") != "0"


def early_launch(enabled: bool | None = None) -> bool:
    """Whether a new specialization launches before its C launcher is built; with
    ``enabled``, switch it first."""
    global _EARLY
    if enabled is not None:
        _EARLY = bool(enabled)
    return _EARLY


def _early(compiled: Any, entry: _Entry, device: int) -> bool:
    """Give ``entry`` the early launch (``_EarlyLaunch``) and queue its C launcher's build;
    False where the early path does not apply: the caller builds the C launcher now, as
    Triton does. Triton's own checks (shared memory, threads per block) are left to Triton:
    a kernel that fails them takes its path and raises there."""
    if not _EARLY or entry.coop or entry.pdl or internals.triton_launcher_built(compiled):
        return False
    packers = _packers(entry.types)
    if packers is None or _libcuda() is None or not internals.triton_driver_is_cuda():
        return False
    utils = internals.triton_driver().utils
    if entry.shared > utils.get_device_properties(device)["max_shared_mem"]:
        return False
    _, function, _, _, max_threads = utils.load_binary(
        compiled.name, compiled.kernel, entry.shared, device
    )
    if entry.block > max_threads:
        return False
    entry.function = function
    entry.launch = _EarlyLaunch(packers)
    BUILDS.submit(compiled, entry)
    return True


def _pointer(a: Any) -> Any:
    return a  # resolved in _EarlyLaunch (the C launcher's getPointer)


def _fp16(a: Any) -> ctypes.c_uint16:
    return ctypes.c_uint16(struct.unpack("=H", struct.pack("=e", a))[0])  # PyFloat_Pack2


def _bf16(a: Any) -> ctypes.c_uint16:
    # The C launcher's pack_bf16: the float32's upper half (truncated, not rounded).
    return ctypes.c_uint16(struct.unpack("=I", bytes(ctypes.c_float(a)))[0] >> 16)


# Parameter type -> what the C launcher stores for it (its PyArg_ParseTuple format and
# FLOAT_STORAGE_TYPE: doubles narrowed by a C cast, fp16 packed, bf16 truncated).
_PACKERS: dict[str, Callable[[Any], Any]] = {
    "i1": ctypes.c_int8,
    "i8": ctypes.c_int8,
    "i16": ctypes.c_int16,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "u1": ctypes.c_uint8,
    "u8": ctypes.c_uint8,
    "u16": ctypes.c_uint16,
    "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64,
    "fp16": _fp16,
    "bf16": _bf16,
    "fp32": ctypes.c_float,
    "f32": ctypes.c_float,
    "fp64": ctypes.c_double,
}


def _packers(types: Sequence[Any]) -> tuple | None:
    """One packer per parameter (None: a constexpr, not passed; ``_pointer``: a pointer), or
    None where a type is not one the early path takes (tuples, tensor descriptors)."""
    out = []
    for ty in types:
        if not isinstance(ty, str):
            return None
        if ty == "constexpr":
            out.append(None)
        elif ty.startswith("*"):
            out.append(_pointer)
        elif ty in _PACKERS:
            out.append(_PACKERS[ty])
        else:
            return None
    return tuple(out)


class _LibCuda:
    """The CUDA driver functions the early launch calls, through ctypes."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        vp, ui = ctypes.c_void_p, ctypes.c_uint
        self.launch = lib.cuLaunchKernel
        self.launch.argtypes = [vp, ui, ui, ui, ui, ui, ui, ui, vp, ctypes.POINTER(vp), vp]
        self.launch.restype = ctypes.c_int
        self.ctx_get_current = lib.cuCtxGetCurrent
        self.ctx_get_current.argtypes = [ctypes.POINTER(vp)]
        self.device_get = lib.cuDeviceGet
        self.device_get.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        self.primary_ctx_retain = lib.cuDevicePrimaryCtxRetain
        self.primary_ctx_retain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
        self.ctx_set_current = lib.cuCtxSetCurrent
        self.ctx_set_current.argtypes = [vp]
        self.pointer_attribute = lib.cuPointerGetAttribute
        self.pointer_attribute.argtypes = [vp, ctypes.c_int, ctypes.c_uint64]
        self.error_string = lib.cuGetErrorString
        self.error_string.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def check(self, code: int) -> None:
        if code != 0:
            text = ctypes.c_char_p()
            self.error_string(code, ctypes.byref(text))
            raise RuntimeError(f"Triton Error [CUDA]: {(text.value or b'').decode()}")


_LIBCUDA: list[_LibCuda | None] = []  # [] until first looked for; [None] where absent
_CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3
_CUDA_ERROR_INVALID_VALUE = 1


def _libcuda() -> _LibCuda | None:
    if not _LIBCUDA:
        try:
            _LIBCUDA.append(_LibCuda(ctypes.CDLL("libcuda.so.1")))
        except (OSError, AttributeError):  # no NVIDIA driver: the C launcher, as Triton does
            _LIBCUDA.append(None)
    return _LIBCUDA[0]


class _EarlyLaunch:
    """Triton's C ``launch`` for one kernel signature, done from Python with ctypes: called as
    the C launcher is (``_direct``), it makes the same driver calls with the same bytes.

    In order, as the generated C does: a current context (the primary context of device 0
    where a thread has none), the hooks, each pointer resolved as the device sees it
    (``cuPointerGetAttribute``: a host tensor raises ValueError), the parameters packed as
    the C launcher stores them, the global and profile scratch pointers last, and
    ``cuLaunchKernel`` with a block of 32 x num_warps threads unless the grid is empty.
    """

    __slots__ = ("n_params", "packers")

    def __init__(self, packers: tuple) -> None:
        self.packers = packers
        self.n_params = sum(p is not None for p in packers) + 2

    def __call__(self, gx, gy, gz, stream, function, coop, pdl, global_scratch, profile_scratch,
                 kernel_metadata, launch_metadata, enter_hook, exit_hook, *args):  # fmt: skip
        cuda = _libcuda()
        assert cuda is not None  # _early checked it
        ctx = ctypes.c_void_p()
        cuda.check(cuda.ctx_get_current(ctypes.byref(ctx)))
        if not ctx.value:
            dev = ctypes.c_int()
            cuda.check(cuda.device_get(ctypes.byref(dev), 0))
            cuda.check(cuda.primary_ctx_retain(ctypes.byref(ctx), dev.value))
            cuda.check(cuda.ctx_set_current(ctx))
        num_warps, num_ctas, shared = kernel_metadata
        if enter_hook is not None:
            enter_hook(launch_metadata)
        values = []
        for i, (pack, a) in enumerate(zip(self.packers, args, strict=True)):
            if pack is None:
                continue
            values.append(_device_pointer(cuda, a, i) if pack is _pointer else pack(a))
        values.append(ctypes.c_uint64(_device_pointer(cuda, global_scratch, -1).value))
        values.append(ctypes.c_uint64(_device_pointer(cuda, profile_scratch, -1).value))
        params = (ctypes.c_void_p * self.n_params)(*(ctypes.addressof(v) for v in values))
        if gx * gy * gz > 0:
            block = 32 * num_warps
            code = cuda.launch(function, gx * num_ctas, gy, gz, block, 1, 1, shared, stream,
                               params, None)  # fmt: skip
            cuda.check(code)
        if exit_hook is not None:
            exit_hook(launch_metadata)


def _device_pointer(cuda: _LibCuda, a: Any, index: int) -> ctypes.c_uint64:
    """The C launcher's getPointer: None is null, an int is taken as is, anything else by its
    ``data_ptr()``, resolved to the address the device uses."""
    if a is None:
        return ctypes.c_uint64(0)
    if isinstance(a, int):
        return ctypes.c_uint64(a)
    ptr = a.data_ptr()
    if not isinstance(ptr, int):
        raise TypeError("data_ptr method of Pointer object must return 64-bit int")
    if not ptr:
        return ctypes.c_uint64(0)
    out = ctypes.c_uint64()
    status = cuda.pointer_attribute(
        ctypes.byref(out), _CU_POINTER_ATTRIBUTE_DEVICE_POINTER, ctypes.c_uint64(ptr)
    )
    if status == _CUDA_ERROR_INVALID_VALUE:
        raise ValueError(
            f"Pointer argument (at {index}) cannot be accessed from Triton (cpu tensor?)"
        )
    cuda.check(status)
    return out


class _LauncherBuilds:
    """Triton's C launchers of early-launched kernels, built on daemon threads (the C
    compiler runs in a subprocess: the threads wait without the GIL), each put in place of
    its entry's early launch when built. A build that fails leaves the early launch, which
    is correct, only slower per call."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.pending = 0
        self.built = 0
        self.failed: list[str] = []
        self.closed = False

    def workers(self) -> int:
        return max(1, min(8, (os.cpu_count() or 2) // 2))

    def submit(self, compiled: Any, entry: _Entry) -> None:
        with self._lock:
            if self.closed:
                return
            self.pending += 1
            if len(self._threads) < min(self.workers(), self.pending):
                t = threading.Thread(target=self._work, name="tritonkit-launcher", daemon=True)
                self._threads.append(t)
                t.start()
        self._queue.put((compiled, entry))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            compiled, entry = item
            try:
                if not self.closed:
                    runner = internals.triton_driver().launcher_cls(compiled.src, compiled.metadata)
                    entry.launch = runner.launch
                    self.built += 1
            except Exception as exc:  # no C compiler, say: the early launch stays
                self.failed.append(f"{compiled.name}: {type(exc).__name__}: {exc}"[:300])
            finally:
                with self._lock:
                    self.pending -= 1
                    if self.pending == 0:
                        self._idle.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued build has finished; False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: self.pending == 0, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """At exit: drop the builds not started, let the running ones finish (a build killed
        mid-way would leave its temporary directory behind)."""
        self.closed = True
        with self._lock:
            for _ in self._threads:
                self._queue.put(None)
        self.wait(timeout)


BUILDS = _LauncherBuilds()
atexit.register(BUILDS.close)


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


class _Warmup:
    """The ``tritonkit.warmup`` session that every launch of the process goes to while it
    runs (warmup.py), or None. Not per thread: a warmed backward runs on autograd's threads."""

    session: Any = None


WARMUP = _Warmup()


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

# On unless TRITONKIT_PIPELINE=0 (measurements compare the two).
_PIPELINE = os.environ.get("TRITONKIT_PIPELINE", "1") != "0"


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
