"""Replay: a call of an operator with metadata seen before runs from C++, without Python.

A tritonkit operator call is Python around a few kernel launches: validation, layout and config
choices, allocations, launches, and for a call that needs gradients an autograd.Function whose
backward runs more Python on the autograd engine's device thread. On the H100/H200 hosts that
Python costs several times what PyTorch's own C++ ops cost per call (docs/performance.md,
"host time"), and at small and medium shapes the host, not the GPU, sets the pace.

Everything that Python decides depends only on the inputs' metadata: shapes, strides, dtypes,
devices, which inputs need gradients, pointer alignment, and the non-tensor arguments. So
``apply`` (registry.py) keys each call by that metadata. The second call with a key runs as
usual while it is recorded: a dispatch mode sees every ATen op the call makes (allocations,
views, zero fills, contiguous copies are recorded; anything else makes the key unreplayable),
the launch path (launch.py) reports every kernel launch with its CUfunction and parameters,
and the Function's backward, when it runs, is recorded the same way. From then on a call with
that key runs the recorded program from C++ (replay.cpp): one pybind call that allocates,
launches, and builds a C++ autograd node whose backward replays the recorded backward.

What stays on the Python path: the CPU interpreter, anything that is not plain eager mode
(torch.compile tracing, dispatch modes, functorch, the profiler), tensor subclasses, and keys
whose recording failed (a launch through Triton's own launcher, an ATen op that computes, an
output aliasing an input). ``STATS`` counts replays, recordings and failures with their reasons.
The C++ module is built on first use with torch.utils.cpp_extension (the same compiler Triton
needs on a GPU machine); if it cannot be built, replay stays off and ``STATS.disabled`` says why.
"""

from __future__ import annotations

import os
import struct
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tritonkit import _tuning
from tritonkit.ops._core import internals
from tritonkit.ops._core import launch as _launch
from tritonkit.ops._core.plan import PLANS, current_env, tensor_meta

ENV = "TRITONKIT_REPLAY"  # "0": never replay

# Step and parameter kinds, as replay.cpp numbers them.
ALLOC, VIEW, ZERO, LAUNCH, CONTIG = 0, 1, 2, 3, 4
PTR, I8, I16, I32, I64, F16, F32, F64, NULLPTR = range(9)
_INT_KINDS = {
    "i1": (I8, 8),
    "i8": (I8, 8),
    "u1": (I8, 8),
    "u8": (I8, 8),
    "i16": (I16, 16),
    "u16": (I16, 16),
    "i32": (I32, 32),
    "u32": (I32, 32),
    "i64": (I64, 64),
    "u64": (I64, 64),
}


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
            _builder = threading.Thread(target=_build, name="tritonkit-replay-build", daemon=True)
            _builder.start()
    if wait:
        _builder.join()
    return _ext


_builder: threading.Thread | None = None


def _build() -> None:
    global _ext
    try:
        from torch.utils import cpp_extension

        _ext = cpp_extension.load(
            name="tritonkit_replay",
            sources=[str(Path(__file__).with_name("replay.cpp"))],
            extra_cflags=["-O2"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, no headers: replay stays off, said once
        STATS.disabled = f"{type(exc).__name__}: {exc}"[:500]
        warnings.warn(
            f"tritonkit: replay disabled, calls take the Python path ({STATS.disabled})",
            stacklevel=2,
        )


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
            parts.append(tensor_meta(a))
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


# ---- recording -------------------------------------------------------------------------------


class Unreplayable(Exception):
    pass


class _Program:
    """Slots and steps of one recorded program (forward or backward)."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []  # slot -> the tensor recorded in it
        self.roots: list[int] = []  # slots that own their storage (inputs, allocations)
        self.steps: list[tuple] = []

    def add(self, t: torch.Tensor, root: bool) -> int:
        self.tensors.append(t)
        slot = len(self.tensors) - 1
        if root:
            self.roots.append(slot)
        return slot


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Recording:
    """One call being recorded: its forward program, then (if gradients follow) its backward."""

    def __init__(self, key: tuple, env: Any, args: tuple, grad: bool) -> None:
        self.key, self.env = key, env
        self.grad = grad
        self.concluded = False
        self.pending = 0  # calls of the key since, while its backward has not run
        self.error: str | None = None
        self.fwd = _Program()
        self.inputs = [a for a in args if isinstance(a, torch.Tensor)]
        for t in self.inputs:
            self.fwd.add(t, root=True)
        self.prog = self.fwd
        self.outputs: list[int] = []
        self.single = True
        self.differentiable: list[bool] = []
        # backward: symbolic slots ("saved", forward slot) / ("grad", i) / ("new", k) until
        # finish() numbers them as replay.cpp expects: saved, then gradients, then new ones.
        self.bwd: _Program | None = None
        self.bwd_saved: dict[int, int] = {}  # forward root slot -> backward slot
        self.bwd_grads: list[int] = []  # backward slot of each gradient
        self.grad_slots: list[int] = []

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = why

    # -- tensors to slots

    def _root_for(self, t: torch.Tensor) -> int:
        prog = self.prog
        storage, ptr = _storage(t), t.data_ptr()
        # Candidates: this program's roots, and in the backward the forward's roots (saved).
        found = [("own", r, prog.tensors[r]) for r in prog.roots]
        if prog is self.bwd:
            found += [("fwd", r, self.fwd.tensors[r]) for r in self.fwd.roots]
        found = [c for c in found if _storage(c[2]) == storage]
        if not found:
            raise Unreplayable(f"a tensor of unknown origin ({tuple(t.shape)}, {t.dtype})")
        exact = [c for c in found if c[2].data_ptr() == ptr]
        if len(exact) == 1 or len(found) == 1 or len({c[2].data_ptr() for c in found}) == 1:
            where, r, _ = (exact or found)[0]
        else:
            raise Unreplayable("a tensor inside the storage of two inputs")
        return r if where == "own" else self._saved_slot(r)

    def _saved_slot(self, fwd_slot: int) -> int:
        """The backward slot of a forward root (added to the saved list on first use)."""
        assert self.bwd is not None
        slot = self.bwd_saved.get(fwd_slot)
        if slot is None:
            slot = self.bwd_saved[fwd_slot] = self.bwd.add(self.fwd.tensors[fwd_slot], root=True)
        return slot

    def pointer(self, t: torch.Tensor) -> tuple[int, int]:
        """(root slot, byte offset) of a tensor's data pointer."""
        root = self._root_for(t)
        return root, t.data_ptr() - self.prog.tensors[root].data_ptr()

    def slot(self, t: torch.Tensor) -> int:
        """A slot holding exactly ``t`` (shape, strides, offset): a root, or a new view."""
        root = self._root_for(t)
        r = self.prog.tensors[root]
        if (
            r.data_ptr() == t.data_ptr()
            and r.shape == t.shape
            and r.stride() == t.stride()
            and r.dtype == t.dtype
        ):
            return root
        if r.dtype != t.dtype:
            raise Unreplayable("a view with another dtype")
        slot = self.prog.add(t, root=False)
        offset = t.storage_offset() - r.storage_offset()
        self.prog.steps.append((VIEW, slot, root, list(t.shape), list(t.stride()), offset))
        return slot

    # -- events from the dispatch mode and the launch path

    def alloc(self, t: torch.Tensor) -> int:
        slot = self.prog.add(t, root=True)
        proto = torch.empty(0, dtype=t.dtype)
        self.prog.steps.append((ALLOC, slot, list(t.shape), list(t.stride()), proto))
        return slot

    def zero(self, t: torch.Tensor) -> None:
        self.prog.steps.append((ZERO, self.slot(t)))

    def contiguous(self, src: torch.Tensor, out: torch.Tensor) -> None:
        base = self.slot(src)
        slot = self.prog.add(out, root=True)
        self.prog.steps.append((CONTIG, slot, base))

    def launch(self, entry: Any, grid: tuple, values: Sequence[Any]) -> None:
        if _tuning.searching():  # a tuner's timing runs are not the call's program
            self.fail(_TUNED)
        if self.error is not None:
            return
        try:
            args = []
            for ty, v in zip(entry.types, values):
                args.extend(self._param(ty, v))
            if entry.scratch:  # global scratch, allocated for each replayed launch
                nbytes = entry.scratch * grid[0] * grid[1] * grid[2]
                # The dispatch mode records this allocation, as any other of the call's.
                buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                args.append((PTR, *self.pointer(buf), 0))
            else:
                args.append((NULLPTR, -1, 0, 0))
            args.append((NULLPTR, -1, 0, 0))  # profile scratch
            self.prog.steps.append(
                (LAUNCH, -1, entry.function, list(grid), entry.block, entry.shared, args)
            )
        except Unreplayable as exc:
            self.fail(str(exc))

    def _param(self, ty: Any, v: Any) -> list[tuple]:
        if ty == "constexpr":
            return []
        if not isinstance(ty, str):
            raise Unreplayable(f"a tuple parameter {ty}")
        if ty.startswith("*"):
            if not isinstance(v, torch.Tensor):
                raise Unreplayable(f"a pointer parameter of type {type(v).__name__}")
            root, off = self.pointer(v)
            return [(PTR, root, off, 0)]
        if ty in _INT_KINDS:
            kind, bits = _INT_KINDS[ty]
            return [(kind, -1, 0, int(v) & ((1 << bits) - 1))]
        if ty in ("fp32", "f32"):
            return [(F32, -1, 0, struct.unpack("<I", struct.pack("<f", float(v)))[0])]
        if ty == "fp64":
            return [(F64, -1, 0, struct.unpack("<Q", struct.pack("<d", float(v)))[0])]
        if ty == "fp16":
            return [(F16, -1, 0, struct.unpack("<H", struct.pack("<e", float(v)))[0])]
        raise Unreplayable(f"a parameter of type {ty}")

    # -- the two halves

    def finish_forward(self, out: Any) -> None:
        outs = out if isinstance(out, tuple) else (out,)
        self.single = not isinstance(out, tuple)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise Unreplayable("an output that is not a tensor")
        input_storages = {_storage(t) for t in self.inputs}
        for o in outs:
            if _storage(o) in input_storages:
                raise Unreplayable("an output aliasing an input")
            self.outputs.append(self.slot(o))
            self.differentiable.append(bool(o.requires_grad) if self.grad else False)

    def start_backward(self, grads: tuple) -> None:
        self.bwd = _Program()
        self.prog = self.bwd
        for g in grads:
            self.bwd_grads.append(self.bwd.add(g, root=isinstance(g, torch.Tensor)))

    def finish_backward(self, result: Any) -> None:
        result = result if isinstance(result, tuple) else (result,)
        tensor_args = [i for i, a in enumerate(self._arg_kinds) if a]
        slots = []
        for i in tensor_args:
            g = result[i] if i < len(result) else None
            slots.append(self.slot(g) if isinstance(g, torch.Tensor) else -1)
        self.grad_slots = slots

    def plan(self, ext: Any) -> Any:
        """The C++ plan of a finished recording."""
        fwd_steps = self.fwd.steps
        saved: list[int] = []
        bwd_steps: list[tuple] = []
        n_bwd = 0
        grad_slots: list[int] = []
        grad_used: list[bool] = []
        if self.bwd is not None:
            # Number the backward's slots: saved forward roots, then gradients, then the rest.
            saved = list(self.bwd_saved)
            order = [self.bwd_saved[f] for f in saved] + self.bwd_grads
            taken = set(order)
            order += [i for i in range(len(self.bwd.tensors)) if i not in taken]
            new = {old: i for i, old in enumerate(order)}
            n_bwd = len(order)
            for step in self.bwd.steps:
                bwd_steps.append(_renumber(step, new))
            grad_slots = [new[s] if s >= 0 else -1 for s in self.grad_slots]
            used = _slots_read(self.bwd.steps) | {s for s in self.grad_slots if s >= 0}
            grad_used = [s in used for s in self.bwd_grads]
        return ext.make_plan(
            len(self.inputs),
            len(self.fwd.tensors),
            fwd_steps,
            self.outputs,
            self.differentiable,
            saved,
            self.bwd is not None,
            n_bwd,
            bwd_steps,
            grad_slots,
            grad_used,
        )


def _slots_read(steps: list[tuple]) -> set[int]:
    """Slots a program's steps read (views, copies, zero fills, launch pointers)."""
    read: set[int] = set()
    for step in steps:
        if step[0] in (VIEW, CONTIG):
            read.add(step[2])
        elif step[0] == ZERO:
            read.add(step[1])
        elif step[0] == LAUNCH:
            read.update(s for k, s, _, _ in step[6] if k == PTR)
    return read


def _renumber(step: tuple, new: dict[int, int]) -> tuple:
    t = step[0]
    if t == ALLOC:
        return (ALLOC, new[step[1]], *step[2:])
    if t == VIEW:
        return (VIEW, new[step[1]], new[step[2]], *step[3:])
    if t == ZERO:
        return (ZERO, new[step[1]])
    if t == CONTIG:
        return (CONTIG, new[step[1]], new[step[2]])
    args = [(k, new[s] if k == PTR else s, off, bits) for k, s, off, bits in step[6]]
    return (*step[:6], args)


_ALLOCS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}
_ZEROS = {"zeros", "zeros_like", "new_zeros"}
_PASS = {"detach", "alias", "lift_fresh", "_unsafe_view"}


class _Mode(internals.dispatch_mode_class()):
    """Sees every ATen op of the recorded call and tells the recording what it must redo."""

    def __init__(self, rec: Recording) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        rec = self.rec
        if _tuning.searching():
            rec.fail(_TUNED)
        if rec.error is not None:
            return out
        name = func.overloadpacket.__name__
        try:
            if name in _ALLOCS:
                rec.alloc(out)
            elif name in _ZEROS:
                rec.alloc(out)
                rec.zero(out)
            elif name == "zero_" or (name == "fill_" and args[1] == 0):
                rec.zero(args[0])
            elif name == "clone" and (kwargs or {}).get("memory_format") in (
                None,
                torch.contiguous_format,
            ):
                if not out.is_contiguous():
                    raise Unreplayable("a clone that is not contiguous")
                rec.contiguous(args[0], out)
            elif func.is_view or name in _PASS:
                pass
            else:
                raise Unreplayable(f"an ATen op that computes ({func})")
        except Unreplayable as exc:
            rec.fail(str(exc))
        return out


class _Active:
    """Routes this thread's launches to a recording, with the dispatch mode watching its ops."""

    def __init__(self, rec: Recording) -> None:
        self.rec = rec

    def __enter__(self) -> Recording:
        self._mode = _Mode(self.rec)
        self._mode.__enter__()
        self._saved = _launch.RECORDER.rec
        _launch.RECORDER.rec = self.rec
        return self.rec

    def __exit__(self, *exc) -> None:
        _launch.RECORDER.rec = self._saved
        self._mode.__exit__(*exc)


# ---- the plans -------------------------------------------------------------------------------

# A key's entry in the plan cache (plan.PLANS): calls seen (int) before recording, a
# Recording in progress, a _Ready C++ plan, or False (unreplayable).
_RECORD_AT = 2  # the first call compiles and tunes; the second is recorded
_MAX_PENDING = 8  # calls a recording may wait for its backward before it is abandoned
_TUNED = "a choice was tuned during the recording"  # not the key's fault: record it again


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
            return out

        @staticmethod
        def backward(ctx, *grads):
            rec: Recording | None = getattr(ctx, "_tk_recording", None)
            # A backward run again (retain_graph) is not recorded twice: the first one is the
            # plan's, or the recording already failed.
            if rec is None or rec.error is not None or rec.concluded:
                return function.backward(ctx, *grads)
            grads = tuple(g.contiguous() if isinstance(g, torch.Tensor) else g for g in grads)
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


def call(function: type, args: tuple, run_python: Callable[[bool], Any]) -> Any:
    """Run ``function`` on ``args``: replayed if its key has a plan, recorded if it is due,
    else ``run_python(grad)`` (registry.apply's own path). The caller checked plain eager mode.
    """
    key, tensors, grad = _key(function, args, torch.is_grad_enabled())
    if key is None or _SUSPENDED.on:
        return run_python(grad)
    env = current_env()
    try:
        entry = PLANS.peek(key, env)
    except TypeError:  # an argument that does not hash
        return run_python(grad)
    if entry.__class__ is _Ready:
        outs = _ext.run(entry.plan, tensors, grad)
        return outs[0] if entry.single else tuple(outs)
    return _not_ready(function, key, env, args, grad, entry or 0, run_python)


def _not_ready(function, key, env, args, grad, entry, run_python) -> Any:
    if entry is False:
        return run_python(grad)
    if isinstance(entry, Recording):  # waiting for its backward
        entry.pending += 1
        if entry.pending > _MAX_PENDING:
            PLANS.put(key, env, 0)
        return run_python(grad)
    if extension() is None or entry + 1 < _RECORD_AT:  # the first call starts the build
        PLANS.put(key, env, entry + 1)
        return run_python(grad)
    return _record(function, key, env, args, grad)


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
                from tritonkit.ops._core.registry import _NoGradContext

                out = function.forward(_NoGradContext(len(args)), *args)
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
