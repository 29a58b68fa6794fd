"""The first launches of a new kernel specialization, before its C launcher is built.

Triton's C launcher is generated per kernel signature and built with the system's C compiler
(a third of a second or more, once per signature, on the first call of every specialization a
Triton cache has not seen: in a process from empty caches most of the time its first calls
take, beside compiling the kernels). Until it is built, a kernel whose parameters are
pointers, integers and floats (not tuples or tensor descriptors; no cooperative grid, no PDL,
one CTA) is launched through the CUDA driver from Python (``EarlyLaunch``: the same
CUfunction, grid, block, shared memory and parameter bytes as the C launcher passes, with
``ctypes``), while the C launcher is built on a thread of its own (``LauncherBuilds``) and
replaces it in the entry (launch.py's ``_Entry``) when ready. ``TRITONKIT_EARLY_LAUNCH=0``
turns it off.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import queue
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tritonkit.ops._core import internals

# The early path is on unless TRITONKIT_EARLY_LAUNCH=0 (measurements compare the two).
_EARLY = os.environ.get("TRITONKIT_EARLY_LAUNCH", "1") != "0"


def enabled(on: bool | None = None) -> bool:
    """Whether a new specialization launches before its C launcher is built; with ``on``,
    switch it first."""
    global _EARLY
    if on is not None:
        _EARLY = bool(on)
    return _EARLY


def attach(compiled: Any, entry: Any, device: int) -> bool:
    """Give ``entry`` (launch.py's ``_Entry``) the early launch and queue its C launcher's build;
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
    entry.launch = EarlyLaunch(packers)
    BUILDS.submit(compiled, entry)
    return True


def _pointer(a: Any) -> Any:
    return a  # resolved in EarlyLaunch (the C launcher's getPointer)


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


class EarlyLaunch:
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
        assert cuda is not None  # attach checked it
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


class LauncherBuilds:
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

    def submit(self, compiled: Any, entry: Any) -> None:
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


BUILDS = LauncherBuilds()
atexit.register(BUILDS.close)
