"""Replay (ops/_core/replay.py, replay.cpp): a recorded call run again from C++.

On the CPU the kernels are stand-ins: a fake kernel reports its launch to the recording as the
launch path does on the GPU, and computes on the tensors; replay.cpp's test launcher receives
the replayed launches' parameters (raw host pointers and packed scalars) and computes the same
from the pointers. So the recorded program, the C++ executor and its autograd node are checked
end to end without a GPU: results, gradients, which tensors the launches read and write.
"""

from __future__ import annotations

import ctypes
import gc
import struct
import threading

import numpy as np
import pytest
import torch

from tritonkit.ops._core import launch, replay
from tritonkit.ops._core.replay import NoGradContext

ext = replay.extension(wait=True)
pytestmark = pytest.mark.skipif(ext is None, reason=f"replay not built: {replay.STATS.disabled}")


class _Entry:
    """What launch.py's _Entry gives a recording: a scale kernel y[i] = alpha * x[i]."""

    function = 77
    block = 128
    shared = 0
    scratch = 0
    types = ("*fp32", "*fp32", "i32", "fp32", "constexpr")


def _scale(x: torch.Tensor, y: torch.Tensor, alpha: float) -> None:
    """The stand-in kernel, launched as the launch path launches: reported, then run."""
    if launch.RECORDER.rec is not None:
        launch.RECORDER.rec.launch(_Entry, (3, 1, 1), (x, y, x.numel(), alpha, 1024))
    with torch.no_grad():
        y.numpy()[...] = x.numpy() * np.float32(alpha)


class _AxpyEntry:
    """out[i] = alpha * x[i] + y[i]."""

    function = 78
    block = 64
    shared = 0
    scratch = 0
    types = ("*fp32", "*fp32", "*fp32", "i32", "fp32")


def _axpy(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, alpha: float) -> None:
    if launch.RECORDER.rec is not None:
        launch.RECORDER.rec.launch(_AxpyEntry, (1, 1, 1), (x, y, out, x.numel(), alpha))
    with torch.no_grad():
        out.numpy()[...] = x.numpy() * np.float32(alpha) + y.numpy()


LAUNCHES: list[tuple] = []


def _floats(address: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(address))


def _test_launcher(function, grid, block, shared, args):
    LAUNCHES.append((function, grid, block, shared, args))
    if function == 78:
        (_, xp), (_, yp), (_, op), (_, n), (_, alpha_bits), _, _ = args
        alpha = struct.unpack("<f", struct.pack("<I", alpha_bits))[0]
        _floats(op, n)[:] = _floats(xp, n) * np.float32(alpha) + _floats(yp, n)
        return
    assert function == 77 and grid == (3, 1, 1) and block == 128
    (_, xp), (_, yp), (_, n), (_, alpha_bits), (k1, _), (k2, _) = args
    assert (k1, k2) == (replay.NULLPTR, replay.NULLPTR)
    alpha = struct.unpack("<f", struct.pack("<I", alpha_bits))[0]
    _floats(yp, n)[:] = _floats(xp, n) * np.float32(alpha)


class ScaleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        y = torch.empty_like(x)
        _scale(x, y, alpha)
        ctx.alpha = alpha
        return y

    @staticmethod
    def backward(ctx, g):
        dx = torch.empty_like(g)
        _scale(g, dx, ctx.alpha)
        return dx, None


def _call(function, args, run_python):
    """replay.call, and the Python path it leaves to its caller (registry.apply's)."""
    out = replay.call(function, args)
    if out is replay.WITH_GRAD:
        return run_python(True)
    if out is replay.FORWARD_ONLY:
        return run_python(False)
    return out


def _python(x, alpha, _grad=None):
    def run(grad):
        if grad:
            return ScaleFunction.apply(x, alpha)
        return ScaleFunction.forward(NoGradContext(2), x, alpha)

    return run


@pytest.fixture(autouse=True)
def _fresh():
    replay.reset()
    LAUNCHES.clear()
    ext.set_test_launcher(_test_launcher)
    with replay.on_host():
        yield
    ext.set_test_launcher(None)
    replay.reset()


@pytest.mark.parametrize("grad", [False, True])
def test_third_call_replays_with_the_same_results(grad):
    pool = torch.randn(4, 256)  # rows 1 KiB apart: one pointer residue, as the GPU's allocator
    outs = []
    for i in range(4):
        x = pool[i, :185].view(37, 5).detach().requires_grad_(grad)
        y = _call(ScaleFunction, (x, 2.5), _python(x, 2.5, grad))
        torch.testing.assert_close(y, x.detach() * 2.5, rtol=0, atol=0)
        if grad:
            g = torch.randn_like(y)
            (dx,) = torch.autograd.grad(y, x, g)
            torch.testing.assert_close(dx, g * 2.5, rtol=0, atol=0)
        outs.append(y)
    assert replay.STATS.recordings == 1, replay.STATS
    assert replay.STATS.replays == 2  # calls 3 and 4
    # Calls 3 and 4 launched from C++: forward (and backward) each, on their own tensors.
    assert len(LAUNCHES) == (4 if grad else 2)


POOL = torch.randn(64, 256)  # rows 1 KiB apart: one pointer residue, as the GPU's allocator gives


def _fresh_tensor(i: int, shape: tuple[int, ...]) -> torch.Tensor:
    return POOL[i, : int(np.prod(shape))].view(shape).normal_()


def test_replayed_launch_reads_the_new_tensors():
    x = _fresh_tensor(0, (8, 4))
    for _ in range(2):
        _call(ScaleFunction, (x, 1.0), _python(x, 1.0, False))
    x2 = _fresh_tensor(1, (8, 4))
    y2 = _call(ScaleFunction, (x2, 1.0), _python(x2, 1.0, False))
    (_, _, _, _, args) = LAUNCHES[-1]
    assert args[0][1] == x2.data_ptr() and args[1][1] == y2.data_ptr()
    assert args[2][1] == 32


def test_other_metadata_is_another_key():
    x = torch.randn(8, 4)
    for _ in range(2):
        _call(ScaleFunction, (x, 1.0), _python(x, 1.0, False))
    _call(ScaleFunction, (x, 2.0), _python(x, 2.0, False))  # another alpha
    _call(ScaleFunction, (x.t(), 1.0), _python(x.t(), 1.0))  # strides
    assert replay.STATS.replays == 0


class ComputesFunction(ScaleFunction):
    @staticmethod
    def forward(ctx, x, alpha):
        return x * alpha  # an ATen op that computes: nothing to replay


def test_a_computing_aten_op_is_not_replayed():
    x = torch.randn(8)
    for _ in range(4):
        y = _call(
            ComputesFunction,
            (x, 3.0),
            lambda g: ComputesFunction.forward(NoGradContext(2), x, 3.0),
        )
        torch.testing.assert_close(y, x * 3.0)
    assert replay.STATS.replays == 0 and replay.STATS.recordings == 0
    assert any("computes" in why for why in replay.STATS.failures)
    # A key whose recording failed is marked unreplayable and never recorded again.
    assert sum(replay.STATS.failures.values()) == 1, replay.STATS.failures


class ViewOutputFunction(ScaleFunction):
    @staticmethod
    def forward(ctx, x, alpha):
        buf = torch.empty(2 * x.numel())
        y = buf[x.numel() :].view(x.shape)
        _scale(x, y, alpha)
        ctx.alpha = alpha
        return y


def test_outputs_that_are_views_of_buffers():
    for i in range(4):
        x = _fresh_tensor(i, (6, 5))
        y = _call(
            ViewOutputFunction,
            (x, 0.5),
            lambda g, x=x: ViewOutputFunction.forward(NoGradContext(2), x, 0.5),
        )
        torch.testing.assert_close(y, x * 0.5, rtol=0, atol=0)
        assert y.storage_offset() == 30 and y.untyped_storage().nbytes() == 60 * 4
    assert replay.STATS.replays == 2


class SavedFunction(torch.autograd.Function):
    """y = 3 x, a second output r = 2 x marked non-differentiable; the backward allocates a
    temporary before it reads the saved input (slot numbering), dx = 3 g + 0 x."""

    @staticmethod
    def forward(ctx, x):
        y, r = torch.empty_like(x), torch.empty_like(x)
        _scale(x, y, 3.0)
        _scale(x, r, 2.0)
        ctx.save_for_backward(x, r)
        ctx.mark_non_differentiable(r)
        return y, r

    @staticmethod
    def backward(ctx, g, _gr):
        tmp = torch.empty_like(g)
        _scale(g, tmp, 3.0)
        x, _r = ctx.saved_tensors
        dx = torch.empty_like(g)
        _axpy(x, tmp, dx, 0.0)
        return dx


def test_backward_with_saved_tensors_and_new_buffers():
    for i in range(4):
        x = _fresh_tensor(i, (9, 7)).requires_grad_()
        y, r = _call(SavedFunction, (x,), lambda g, x=x: SavedFunction.apply(x))
        assert not r.requires_grad and y.requires_grad
        torch.testing.assert_close(r, 2 * x.detach(), rtol=0, atol=0)
        g = torch.randn_like(y)
        (dx,) = torch.autograd.grad(y, x, g)
        torch.testing.assert_close(dx, 3 * g, rtol=0, atol=0)
    assert replay.STATS.replays == 2 and replay.STATS.recordings == 1, replay.STATS


def test_a_recording_is_this_threads_alone():
    """Another thread's launches, during this thread's recording, reach no recording."""
    x = _fresh_tensor(0, (37, 5)).requires_grad_(False)
    seen = []

    class Spy(ScaleFunction):
        @staticmethod
        def forward(ctx, x, alpha):
            seen.append(launch.RECORDER.rec is not None)  # this thread: recording
            other = threading.Thread(target=lambda: seen.append(launch.RECORDER.rec is None))
            other.start()
            other.join()
            return ScaleFunction.forward(ctx, x, alpha)

    for _ in range(2):
        _call(Spy, (x, 2.0), _python(x, 2.0))
    assert seen[-2:] == [True, True] and replay.STATS.recordings == 1


def test_reset_while_a_backward_is_pending():
    """The autograd node owns its plan: forgetting every plan (reset, eviction) before the
    backward runs leaves the backward correct."""
    for i in range(2):  # the second call and its backward are recorded
        x = _fresh_tensor(i, (37, 5)).requires_grad_(True)
        y = _call(ScaleFunction, (x, 2.5), _python(x, 2.5))
        torch.autograd.grad(y, x, torch.randn_like(y))
    x = _fresh_tensor(2, (37, 5)).requires_grad_(True)
    y = _call(ScaleFunction, (x, 2.5), _python(x, 2.5))
    assert replay.STATS.replays == 1  # the third call ran from C++ and waits for its backward
    replay.reset()
    gc.collect()
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, g)
    torch.testing.assert_close(dx, g * 2.5, rtol=0, atol=0)


def test_backward_run_twice_while_recording():
    """A recorded call whose backward runs twice (retain_graph, as triton.testing.do_bench
    times a backward) records the first and runs the second as usual."""
    for i in range(3):
        x = _fresh_tensor(i, (37, 5)).requires_grad_(True)
        y = _call(ScaleFunction, (x, 2.5), _python(x, 2.5))
        g = torch.randn_like(y)
        for _ in range(3):
            (dx,) = torch.autograd.grad(y, x, g, retain_graph=True)
            torch.testing.assert_close(dx, g * 2.5, rtol=0, atol=0)
    assert replay.STATS.recordings == 1 and not replay.STATS.failures


def test_tuning_during_a_recording_is_not_kept(monkeypatch):
    """Launches made while a choice is timed are the tuner's: the recording that saw them is
    dropped and the key recorded again at a later call (the cause of a replayed call running
    every candidate's timing launches forever)."""
    from tritonkit import _tuning

    tuned = {"left": 1}

    class Tuning(ScaleFunction):
        @staticmethod
        def forward(ctx, x, alpha):
            if tuned["left"] and launch.RECORDER.rec is not None:
                tuned["left"] -= 1
                monkeypatch.setattr(_tuning._SEARCHING, "on", True)
                _scale(x, torch.empty_like(x), 1.0)  # a timing run
                monkeypatch.setattr(_tuning._SEARCHING, "on", False)
            return ScaleFunction.forward(ctx, x, alpha)

    for i in range(5):
        x = _fresh_tensor(i, (37, 5))
        y = _call(Tuning, (x, 2.5), _python(x, 2.5))
        torch.testing.assert_close(y, x * 2.5, rtol=0, atol=0)
    assert replay.STATS.failures == {replay._TUNED: 1}
    assert replay.STATS.recordings == 1  # recorded again, without the timing launch
    assert replay.STATS.replays >= 1
    steps = [e for _, e in replay.PLANS.items() if type(e) is replay._Ready]
    assert len(steps) == 1


@pytest.mark.parametrize("grad_layout", ["channels_last", "contiguous"])
def test_backward_keeps_a_channels_last_outputs_layout(grad_layout):
    """A channels_last output's gradient reaches the recorded backward (and its replays) in
    channels_last: not copied to NCHW on every step (a conv's backward reads it that way), and
    a gradient that arrives in another layout is converted to the recorded one."""
    pool = torch.randn(4, 256)
    for i in range(4):
        x = pool[i, :120].view(2, 5, 3, 4).detach()  # N, H, W, C in memory
        x = x.permute(0, 3, 1, 2).requires_grad_()  # (2, 4, 5, 3) channels_last
        assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        y = _call(ScaleFunction, (x, 1.5), _python(x, 1.5, True))
        g = torch.randn(y.shape)
        if grad_layout == "channels_last":
            g = g.contiguous(memory_format=torch.channels_last)
        (dx,) = torch.autograd.grad(y, x, g)
        torch.testing.assert_close(dx, g * 1.5, rtol=0, atol=0)
        if i >= 1:  # the recorded call and the replays (the first is the function's own)
            assert dx.is_contiguous(memory_format=torch.channels_last), (i, dx.stride())
    assert replay.STATS.recordings == 1 and replay.STATS.replays == 2, replay.STATS
