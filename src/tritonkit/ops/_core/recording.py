"""Recording one call for replay (replay.py): what its forward and backward allocate, view,
zero, copy and launch, as steps over numbered slots that replay.cpp runs again.

A dispatch mode sees every ATen op of the recorded call (allocations, views, zero fills and
contiguous copies are kept; an op that computes makes the key unreplayable), and the launch
path (launch.py) reports each kernel launch with its CUfunction and parameters to this
thread's recording. A recording that sees a tuner's timing runs drops itself: they are the
tuner's launches, not the call's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import torch

from tritonkit import _tuning
from tritonkit.ops._core import internals
from tritonkit.ops._core import launch as _launch

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
_TUNED = "a choice was tuned during the recording"  # not the key's fault: record it again


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
    # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo unless
    # it opts out, and that wrapper imports torch._dynamo at its first call: seconds, in the
    # call being recorded. A recording runs in plain eager mode only, never under Dynamo.
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

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
