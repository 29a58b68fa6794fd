"""CUDA graphs take the host out of a loop entirely: capture once, replay with one launch.

On the GPU: a block of tritonkit ops (forward and backward) captured with
``torch.cuda.graph`` and replayed on new input values gives what the same block gives eagerly,
and so does ``torch.compile(mode="reduce-overhead")`` (which captures the compiled graph). The
replayed calls are made after the ops' own replay plans exist (ops/_core/replay.py), so the
capture goes through the C++ path too.
"""

from __future__ import annotations

import pytest
import torch

import tritonkit

pytestmark = pytest.mark.gpu  # CUDA graphs

SHAPE = (64, 3000)


def _block(x, w, b):
    h = tritonkit.rms_norm(x, (SHAPE[-1],), w)
    h = tritonkit.bias_act(h, b, "gelu_tanh")
    return tritonkit.softmax(h, -1)


def _params():
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(SHAPE[-1], device="cuda", generator=gen).requires_grad_()
    b = torch.randn(SHAPE[-1], device="cuda", generator=gen).requires_grad_()
    return w, b


def _eager(x, dy, w, b):
    x = x.detach().requires_grad_()
    w, b = (t.detach().requires_grad_() for t in (w, b))
    y = _block(x, w, b)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    return y.detach(), grads


def test_graph_capture_and_replay_give_the_eager_results_forward_and_backward():
    w, b = _params()
    static_x = torch.randn(SHAPE, device="cuda", requires_grad=True)
    static_dy = torch.randn(SHAPE, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, record replay plans) off the capture
        for _ in range(3):
            y = _block(static_x, w, b)
            torch.autograd.grad(y, (static_x, w, b), static_dy)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = _block(static_x, w, b)
        static_grads = torch.autograd.grad(static_y, (static_x, w, b), static_dy)

    for seed in range(3):  # new values in the captured inputs, then one replay
        gen = torch.Generator(device="cuda").manual_seed(100 + seed)
        with torch.no_grad():
            static_x.copy_(torch.randn(SHAPE, device="cuda", generator=gen))
            static_dy.copy_(torch.randn(SHAPE, device="cuda", generator=gen))
        graph.replay()
        want_y, want_grads = _eager(static_x, static_dy, w, b)
        torch.testing.assert_close(static_y, want_y, rtol=0, atol=0)
        for got, want in zip(static_grads, want_grads):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_reduce_overhead_compile_gives_the_eager_results():
    w, b = (t.detach() for t in _params())
    fn = torch.compile(_block, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):
        x = torch.randn(SHAPE, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        with torch.no_grad():
            got = fn(x, w, b).clone()
            want = _block(x, w, b)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
