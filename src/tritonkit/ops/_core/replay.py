"""Replay: a call of an operator with metadata seen before runs from C++, without Python.

A tritonkit operator call is Python around a few kernel launches: validation, layout and config
choices, allocations, launches, and for a call that needs gradients an autograd.Function whose
backward runs more Python on the autograd engine's device thread. That Python costs several
times what PyTorch's own C++ ops cost per call, and at small and medium shapes the host, not
the GPU, sets the pace (docs/performance.md).

What the Python path decides depends only on the call's meta (shapes, strides, dtypes,
devices, which inputs need gradients, pointer alignment, the non-tensor arguments) and its
Env (plan.py). So a call's entry in the one plan cache is keyed by both, as every other plan:
the second call with a key runs as usual while it is recorded (recording.py), and from then
on a call with that key runs the recorded program from C++ (replay.cpp): one pybind call that
allocates, launches, and builds a C++ autograd node whose backward replays the recorded
backward. The node holds its own reference to the program, so forgetting the plan (``reset``,
an eviction) never frees what a pending backward needs.

What stays on the Python path: the CPU interpreter, anything that is not plain eager mode
(torch.compile tracing, dispatch modes, functorch, the profiler), tensor subclasses, and keys
whose recording failed (a launch through Triton's own launcher, an ATen op that computes, an
output aliasing an input). ``STATS`` counts replays, recordings and failures with their reasons.
The C++ module is built with torch.utils.cpp_extension (the same compiler Triton needs on a GPU
machine) on a thread of its own; if it cannot be built, replay stays off and ``STATS.disabled``
says why.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tritonkit.ops._core.plan import PLANS, current_env
from tritonkit.ops._core.recording import (  # noqa: F401 (NULLPTR: the tests' launcher)
    _TUNED,
    NULLPTR,
    Recording,
    Unreplayable,
    _Active,
)

ENV = "TRITONKIT_REPLAY"  # "0": never replay


@dataclass
class Stats:
    recordings: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    disabled: str | None = None

    @property
    def replays(self) -> int:
        """Calls run from C++ since the last ``reset`` (counted by the plans themselves)."""
        return sum(e.plan.runs for _, e in PLANS.items() if type(e) is _Ready)


STATS = Stats()
_ext: Any = None
_ext_lock = threading.Lock()


def extension(wait: bool = False) -> Any:
    """The compiled replay module, or None: not built yet, or not buildable (``STATS.disabled``
    says why).

    The first call starts the build (torch.utils.cpp_extension: a compile of seconds, or a load
    of the cached build) on a thread of its own and returns None; calls take the Python path
    until it is ready, then keys are recorded as usual. So no call waits for a compiler.
    ``wait``: block until the build has finished (tests, tools)."""
    if _ext is not None or STATS.disabled:
        return _ext
    with _ext_lock:
        global _builder
        if _builder is None:
            # Triton's binder imports triton.experimental.gluon on its first use. Imported on
            # this thread while the builder thread imports torch.utils.cpp_extension, it was
            # once left half initialised (on a GPU: "cannot import name 'hopper' from
            # partially initialized module"), so it is imported before the thread starts.
            importlib.import_module("triton.experimental.gluon")
            _builder = threading.Thread(target=_build, name="tritonkit-replay-build", daemon=True)
            _builder.start()
    if wait:
        _builder.join()
    return _ext


_builder: threading.Thread | None = None


_NAME = "tritonkit_replay"
_SOURCE = str(Path(__file__).with_name("replay.cpp"))
_STALE_LOCK_S = 900  # a build takes a minute or two; a lock older than this was abandoned
# The build (or the check that the cached build is current), in a process of its own (see
# _build); it prints where the module is. torch's extension build directory is
# torch.utils.cpp_extension._get_build_directory (internals.NAMES["extension_build_dir"]).
_CHILD = """
import os, sys, time
from torch.utils import cpp_extension
name, source, stale = sys.argv[1], sys.argv[2], float(sys.argv[3])
lock = os.path.join(cpp_extension._get_build_directory(name, False), "lock")
try:
    if time.time() - os.stat(lock).st_mtime > stale:
        os.unlink(lock)
except FileNotFoundError:
    pass
module = cpp_extension.load(name=name, sources=[source], extra_cflags=["-O2"])
print(module.__file__)
"""


def _build() -> None:
    """Compile in a child process of its own session, then load here. A process that exits
    while the extension compiles (a short script, a test) would kill a compile running on
    one of its threads and leave torch's build lock behind, on which every later build waits
    forever; the child finishes the build whatever this process does. A lock left by a
    killed build is removed once it is older than any build takes.

    This process loads the module the child names and never imports
    torch.utils.cpp_extension: that import (setuptools with it) costs tenths of a second of
    the GIL during the process's first calls."""
    global _ext
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, _NAME, _SOURCE, str(_STALE_LOCK_S)],
            start_new_session=True,
            check=True,
            capture_output=True,
            text=True,
            timeout=_STALE_LOCK_S,
        )
        _ext = _load(_NAME, done.stdout.strip().splitlines()[-1])
    except Exception as exc:  # no compiler, no headers: replay stays off, said once
        detail = getattr(exc, "stderr", None) or exc
        STATS.disabled = f"{type(exc).__name__}: {detail}"[-500:]
        warnings.warn(
            f"tritonkit: replay disabled, calls take the Python path ({STATS.disabled})",
            stacklevel=2,
        )


def _load(name: str, path: str) -> Any:
    """The extension module built at ``path``, loaded as torch.utils.cpp_extension loads it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the replay extension from {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0" and not STATS.disabled


# ---- keys ------------------------------------------------------------------------------------


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _key(function: type, args: tuple, grad_mode: bool) -> tuple[tuple | None, list, bool]:
    """(key or None, the tensor arguments, whether a gradient can follow). The key is the
    call's meta; the plan cache adds the Env snapshot to it."""
    parts: list[Any] = ["replay", function]
    tensors = []
    needs_grad = False
    for a in args:
        if type(a) in _PLAIN:
            if not (a.is_cuda or (_HOST.on and a.device.type == "cpu")):
                return None, tensors, _needs_grad(args, grad_mode)  # CPU, meta: not for CUDA
            tensors.append(a)
            rg = a.requires_grad
            needs_grad = needs_grad or rg
            # shape, strides, dtype, device, gradient flag, the pointer's residue mod 256 (paths
            # are picked by 16-byte alignment and finer residues; the allocator aligns to 512)
            parts.append((a.shape, a.stride(), a.dtype, a.get_device(), rg, a.data_ptr() & 255))
        elif isinstance(a, torch.Tensor):  # a subclass: its own dispatch decides
            return None, tensors, _needs_grad(args, grad_mode)
        else:
            parts.append(a)
    grad = grad_mode and needs_grad
    parts.append(grad)
    return tuple(parts), tensors, grad


class _Host(threading.local):
    on = False


_HOST = _Host()


class on_host:
    """Tests: within it, CPU tensors are keyed and replayed too (with replay.cpp's test
    launcher standing in for the GPU)."""

    def __enter__(self) -> None:
        self._was, _HOST.on = _HOST.on, True

    def __exit__(self, *exc) -> None:
        _HOST.on = self._was


def _needs_grad(args: tuple, grad_mode: bool) -> bool:
    return grad_mode and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


# ---- the plans -------------------------------------------------------------------------------

# A key's entry in the plan cache (plan.PLANS): calls seen (int) before recording, a
# Recording in progress, a _Ready C++ plan, or False (unreplayable).
_RECORD_AT = 2  # the first call compiles and tunes; the second is recorded
_MAX_PENDING = 8  # calls a recording may wait for its backward before it is abandoned


class NoGradContext:
    """An autograd.Function's ctx for a forward run without autograd: nothing to keep."""

    def __init__(self, n_inputs: int) -> None:
        self.needs_input_grad = (False,) * n_inputs

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def grad_format(out: Any) -> torch.memory_format:
    """The layout a recorded backward sees its output's gradient in: channels_last where the
    output is (a conv's), else contiguous. replay.cpp's backward applies the same rule to the
    same output, so a replay hands the recorded launches the layout they were recorded with,
    and a channels_last gradient is not copied to NCHW on every step."""
    if (
        isinstance(out, torch.Tensor)
        and out.dim() == 4
        and not out.is_contiguous()
        and out.is_contiguous(memory_format=torch.channels_last)
    ):
        return torch.channels_last
    return torch.contiguous_format


def _recorded_class(function: type) -> type:
    """``function`` with its forward and backward reporting to the recording on ctx."""
    cached = getattr(function, "_tk_recorded", None)
    if cached is not None and cached.__dict__.get("_tk_base") is function:
        return cached

    class Recorded(function):
        _tk_base = function

        @staticmethod
        def forward(ctx, *args):
            out = function.forward(ctx, *args)
            ctx._tk_recording = _CURRENT.rec
            outs = out if isinstance(out, tuple) else (out,)
            ctx._tk_grad_formats = tuple(grad_format(o) for o in outs)
            return out

        @staticmethod
        def backward(ctx, *grads):
            rec: Recording | None = getattr(ctx, "_tk_recording", None)
            # A backward run again (retain_graph) is not recorded twice: the first one is the
            # plan's, or the recording already failed.
            if rec is None or rec.error is not None or rec.concluded:
                return function.backward(ctx, *grads)
            formats = ctx._tk_grad_formats
            grads = tuple(
                g.contiguous(memory_format=formats[i]) if isinstance(g, torch.Tensor) else g
                for i, g in enumerate(grads)
            )
            rec.start_backward(grads)
            with _Active(rec):
                result = function.backward(ctx, *grads)
            try:
                rec.finish_backward(result)
            except Unreplayable as exc:
                rec.fail(str(exc))
            _conclude(rec)
            return result

    Recorded.__name__ = Recorded.__qualname__ = f"Recorded{function.__name__}"
    function._tk_recorded = Recorded
    return Recorded


class _Current(threading.local):
    rec: Recording | None = None


_CURRENT = _Current()


def _conclude(rec: Recording) -> None:
    """Turn a finished recording into a plan, or mark its key unreplayable."""
    rec.concluded = True
    if rec.error is None:
        ext = extension()
        if ext is None:
            return
        try:
            PLANS.put(rec.key, rec.env, _Ready(rec.plan(ext), rec.single))
            STATS.recordings += 1
            return
        except Exception as exc:  # a recording replay.cpp rejects: a bug to report, not fatal
            rec.fail(f"plan: {type(exc).__name__}: {exc}")
    PLANS.put(rec.key, rec.env, 0 if rec.error == _TUNED else False)
    STATS.failures[rec.error] = STATS.failures.get(rec.error, 0) + 1


class _Ready:
    """A key's C++ plan and whether the Function returns one tensor or a tuple."""

    __slots__ = ("plan", "single")

    def __init__(self, plan: Any, single: bool) -> None:
        self.plan, self.single = plan, single


class _Path:
    """What ``call`` returns when the caller runs the call itself, through Python."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


WITH_GRAD = _Path("WITH_GRAD")  # run function.apply: a gradient can follow
FORWARD_ONLY = _Path("FORWARD_ONLY")  # run its forward alone


def call(function: type, args: tuple) -> Any:
    """``function``'s outputs on ``args``, replayed if its key has a plan (or recorded, if
    it is due); else ``WITH_GRAD`` or ``FORWARD_ONLY``: the caller (registry.apply) runs the
    call through Python, as it would without replay. The caller checked plain eager mode."""
    key, tensors, grad = _key(function, args, torch.is_grad_enabled())
    if key is None or _SUSPENDED.on:
        return WITH_GRAD if grad else FORWARD_ONLY
    env = current_env()
    try:
        entry = PLANS.peek(key, env)
    except TypeError:  # an argument that does not hash
        return WITH_GRAD if grad else FORWARD_ONLY
    if entry.__class__ is _Ready:
        outs = _ext.run(entry.plan, tensors, grad)
        return outs[0] if entry.single else tuple(outs)
    if _due(key, env, entry if entry is not None else 0):  # False: unreplayable, kept
        return _record(function, key, env, args, grad)
    return WITH_GRAD if grad else FORWARD_ONLY


def _due(key: tuple, env: Any, entry: Any) -> bool:
    """Whether this call of a key without a plan is the one to record (counting it if not)."""
    if entry is False:
        return False
    if isinstance(entry, Recording):  # waiting for its backward
        entry.pending += 1
        if entry.pending > _MAX_PENDING:
            PLANS.put(key, env, 0)
        return False
    if extension() is None or entry + 1 < _RECORD_AT:  # the first call starts the build
        PLANS.put(key, env, entry + 1)
        return False
    return True


def _record(function: type, key: tuple, env: Any, args: tuple, grad: bool) -> Any:
    rec = Recording(key, env, args, grad)
    rec._arg_kinds = [isinstance(a, torch.Tensor) for a in args]
    PLANS.put(key, env, rec)
    _CURRENT.rec = rec
    try:
        with _Active(rec):
            if grad:
                out = _recorded_class(function).apply(*args)
            else:
                out = function.forward(NoGradContext(len(args)), *args)
    finally:
        _CURRENT.rec = None
    try:
        rec.finish_forward(out)
    except Unreplayable as exc:
        rec.fail(str(exc))
    if rec.error is not None or not grad or not any(rec.differentiable):
        if grad and rec.error is None:
            rec.bwd = None
        _conclude(rec)
    return out


class _Suspended(threading.local):
    on = False


_SUSPENDED = _Suspended()


class suspended:
    """Within it, calls take the Python path and nothing is recorded (the check engine's
    poisoned allocations are ATen fills a recording must not see)."""

    def __enter__(self) -> None:
        self._was = _SUSPENDED.on
        _SUSPENDED.on = True

    def __exit__(self, *exc) -> None:
        _SUSPENDED.on = self._was


def set_poison(on: bool) -> None:
    """Checks: fill every allocation of a replay with NaN (or a sentinel) first."""
    ext = extension()
    if ext is not None:
        ext.set_poison(on)


def reset() -> None:
    """Forget every plan and count (tests; a changed tuning setting). A plan that an autograd
    node still needs stays alive with it."""
    PLANS.reset()
    STATS.recordings = 0
    STATS.failures.clear()
