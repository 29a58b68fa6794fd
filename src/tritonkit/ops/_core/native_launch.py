"""Launches made from C for the calls whose host time is most of their cost: the symmetric-memory
collectives, whose kernel takes less time than Triton's launcher. ``native_launch.c`` holds a
parameter block prepared once per cached launch; a call writes its data pointers and its
workspace counter's epoch and buffer offset into it and calls cuLaunchKernel, without Triton's
launcher (which parses a dozen arguments and resolves every pointer with the driver per call).

The module is compiled by Triton's own C-module builder (cached in Triton's cache, a fraction of
a second once) on first use. Where it cannot be built or the driver cannot be loaded, ``module``
is None, ``Counter`` is the Python stand-in and every launch takes Triton's launcher.
``TRITONKIT_NATIVE_LAUNCH=0`` turns it off.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonkit.ops._core import early_launch, internals

_SOURCE = Path(__file__).with_name("native_launch.c")
_module: list[Any] = []  # [the module or None], once tried


def module() -> Any:
    """The compiled module, or None (off, or not buildable: said once)."""
    if not _module:
        mod = None
        if os.environ.get("TRITONKIT_NATIVE_LAUNCH", "1") != "0":
            try:
                build = internals.resolve(*internals.NAMES["triton_build_module"])
                mod = build(_SOURCE.read_text(), "tritonkit_native_launch")
            except Exception as exc:  # no compiler or headers: Triton's launcher instead
                warnings.warn(f"tritonkit: native launches off ({exc})", stacklevel=2)
        _module.append(mod)
    return _module[0]


class PyCounter:
    """The Python stand-in for the C module's ``Counter``: the barrier epochs and buffer halves
    of one symmetric workspace (collectives/plan.py's SymmWorkspace)."""

    __slots__ = ("calls", "epoch", "numel")

    def __init__(self, numel: int, epoch: int = 0, calls: int = 0) -> None:
        self.numel, self.epoch, self.calls = numel, epoch, calls

    def advance(self, barriers: int) -> tuple[int, int]:
        """(the first barrier's epoch as an int32, the element offset of the buffers' half)
        for the next call, which passes ``barriers`` barriers."""
        first = (self.epoch + 1) & 0xFFFFFFFF
        self.epoch = (self.epoch + barriers) & 0xFFFFFFFF
        half = (self.calls & 1) * self.numel
        self.calls += 1
        return (first - (1 << 32) if first >= (1 << 31) else first), half


def counter(numel: int) -> Any:
    """A workspace counter: the C one where the module is built (so native launches and
    Triton's launches advance the same state), else the Python one."""
    mod = module()
    return mod.Counter(numel) if mod is not None else PyCounter(numel)


def make(
    entry: Any,
    grid: Sequence[int],
    values: Sequence[Any],
    tensor_slots: Sequence[int],
    tensors: Sequence[Any],
    counter_slots: tuple[int, int],
    counter: Any,
    barriers: int,
    device: int,
) -> Any:
    """The C launch of one compiled kernel (``entry``, launch.py's ``_Entry``) as it was just
    launched with ``values`` (its arguments in signature order) and ``tensors`` at
    ``tensor_slots``; ``counter_slots``: the arguments that take the epoch and the buffer
    offset in 16s. None where it cannot be made: no module, a counter of the other kind, a
    parameter type the C launch does not pack, global scratch, a cooperative or PDL launch."""
    mod = module()
    if mod is None or not isinstance(counter, mod.Counter) or entry.scratch:
        return None
    if entry.coop or entry.pdl or not internals.triton_driver_is_cuda():
        return None
    packers = early_launch._packers(entry.types)
    if packers is None or internals.cuda_raw_stream is None:
        return None
    cells, params = [], {}
    for i, (pack, v) in enumerate(zip(packers, values, strict=True)):
        if pack is None:  # a constexpr: not a parameter
            continue
        params[i] = len(cells)
        if i in tensor_slots or i in counter_slots:
            cells.append(bytes(8))  # written per call
        elif pack is early_launch._pointer:
            if not isinstance(v, int):  # only the tables' addresses are fixed pointers
                return None
            cells.append(v.to_bytes(8, "little"))
        else:
            cells.append(bytes(pack(v)).ljust(8, b"\0"))
    cells += [bytes(8), bytes(8)]  # global and profile scratch: none
    epoch_type, offset_type = (entry.types[i] for i in counter_slots)
    if epoch_type != "i32" or offset_type not in ("i32", "i64"):
        return None
    if offset_type == "i32" and counter.numel // 16 >= 1 << 31:  # Triton would take i64
        return None
    context = mod.current_context()
    if context is None:
        return None
    return mod.Launch(
        entry.function,
        (*grid, 1, 1)[:3],
        entry.block,
        entry.shared,
        b"".join(cells),
        tuple(params[i] for i in tensor_slots),
        tuple(t.data_ptr() % 16 == 0 for t in tensors),
        params[counter_slots[0]],
        params[counter_slots[1]],
        counter,
        barriers,
        context,
        internals.cuda_raw_stream,
        device,
    )
