"""The shared launch path's bound launches (``launch.Bound``), which the GPU takes on every
planned call: checked here with a stand-in kernel and compiled launcher, since the direct path
needs a GPU (the interpreter always takes Triton's own launcher)."""

import pytest
import torch

from tritonkit.ops._core import launch as L


class _Kernel:
    """What Bound uses of a Kernel: ``_hooked``, ``_launch`` and ``stats``."""

    def __init__(self, entry: object) -> None:
        self.entry, self.launched = entry, []
        self.stats = {"bound": 0, "direct": 0, "triton": 0}

    def _hooked(self) -> bool:
        return False

    def _launch(self, grid, args, meta):
        self.launched.append(args)
        # As the binder's bound values: every parameter, constexprs included, in order.
        return self.entry, [*args, *meta.values()]


@pytest.fixture
def direct(monkeypatch):
    """The compiled launcher's calls (grid, values), on a stand-in current device 0."""
    calls = []
    monkeypatch.setattr(L, "_direct", lambda entry, grid, device, values: calls.append(values))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return calls


def test_bound_resolves_once_then_substitutes_tensors(direct):
    kernel = _Kernel(entry=object())
    a, b = torch.randn(8), torch.randn(8)
    bound = L.Bound(kernel, (4,), (a, None, 5, b), {"BLOCK": 16})
    assert bound.slots == (0, 3) and kernel.launched == []  # nothing launched by bind
    bound(a, b)
    assert len(kernel.launched) == 1 and kernel.launched[0][0] is a
    # No tensor outlives the call that resolved the entry.
    assert not any(isinstance(v, torch.Tensor) for v in bound._values)
    c, d = torch.randn(8), torch.randn(8)
    bound(c, d)
    assert len(kernel.launched) == 1 and kernel.stats["bound"] == 1
    (values,) = direct
    assert values[0] is c and values[1] is None and values[2] == 5 and values[3] is d
    assert values[4] == 16
    assert not any(isinstance(v, torch.Tensor) for v in bound._values)


def test_bound_takes_the_full_launch_for_another_specialization(direct):
    kernel = _Kernel(entry=object())
    a, b = torch.randn(8), torch.randn(8)
    bound = L.Bound(kernel, (1,), (a, b), {})
    bound(a, b)
    bound(a.half(), b)  # another dtype: another compiled kernel
    assert len(kernel.launched) == 2 and direct == []
    bound(a, b)
    off = torch.randn(9)[1:]  # 4 bytes past a 16-byte boundary: another specialization
    assert off.data_ptr() % 16
    bound(a, off)
    assert len(kernel.launched) == 3 and len(direct) == 1


def test_bound_without_a_direct_entry_always_launches_fully(direct):
    kernel = _Kernel(entry=None)  # the interpreter, hooks, or a kernel with profile scratch
    a = torch.randn(4)
    bound = L.Bound(kernel, (1,), (a,), {})
    for _ in range(3):
        bound(a)
    assert len(kernel.launched) == 3 and direct == []
