"""Layout: how a launcher walks a tensor's memory without copying it, and host-side integer
helpers for grids and blocks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def is_dense(t: torch.Tensor) -> bool:
    """True when t's elements fill exactly ``numel`` consecutive slots of memory in some order.

    Such a tensor (contiguous, or a permutation of a contiguous one such as ``x.t()``) can be
    processed elementwise in storage order, and ``torch.empty_like`` gives an output with the
    same strides, which is what PyTorch's own elementwise ops return.
    """
    if t.is_contiguous():  # the common case, answered without sorting
        return True
    expected = 1
    for size, stride in sorted(
        ((s, st) for s, st in zip(t.shape, t.stride()) if s != 1), key=lambda p: p[1]
    ):
        if stride != expected:
            return False
        expected *= size
    return True


@dataclass(frozen=True)
class Rows:
    """A tensor seen as ``n_rows`` rows of ``n_cols`` unit-stride elements, ``stride_row`` apart."""

    tensor: torch.Tensor
    n_rows: int
    n_cols: int
    stride_row: int


def flat_rows(t: torch.Tensor) -> Rows:
    """A dense tensor as a single row in storage order."""
    n = t.numel()
    return Rows(t, 1, n, max(n, 1))


def row_view(t: torch.Tensor, n_cols: int) -> Rows | None:
    """View t (in logical row-major order) as rows of ``n_cols`` unit-stride elements, or None.

    None means the layout has no such view (for example a slice along a middle dimension);
    the caller then decides whether to copy.
    """
    if t.numel() == 0:  # nothing to walk; any view will do
        return Rows(t, 0, n_cols, max(n_cols, 1))
    if n_cols == 0 or t.numel() % n_cols:
        return None
    try:
        v = t.view(-1, n_cols)
    except RuntimeError:
        return None
    if n_cols > 1 and v.stride(1) != 1:
        return None
    n_rows = v.shape[0]
    stride_row = v.stride(0) if n_rows > 1 else n_cols
    return Rows(t, n_rows, n_cols, stride_row)


class _LayoutCopies:
    """Counts inputs that a launcher had to copy because no strided view of them exists.

    Reports print the count so that a copy never hides inside a timing.
    """

    def __init__(self) -> None:
        self.count = 0

    def reset(self) -> int:
        n, self.count = self.count, 0
        return n


LAYOUT_COPIES = _LayoutCopies()


def as_rows(tensors: Sequence[torch.Tensor], n_cols: int) -> list[Rows]:
    """Views of same-shaped tensors as rows of ``n_cols``; an input with no such view is copied."""
    views = []
    for t in tensors:
        r = row_view(t, n_cols)
        if r is None:
            LAYOUT_COPIES.count += 1
            r = row_view(t.contiguous(), n_cols)
            assert r is not None  # a contiguous tensor always has a row view
        views.append(r)
    return views


def elementwise_output(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A new output for an elementwise op over same-shaped inputs, laid out as PyTorch would.

    Dense inputs with identical strides give an output with those strides (``x.t()`` in,
    ``y.t()``-shaped memory out); anything else gives a contiguous output.
    """
    first = inputs[0]
    if all(is_dense(t) and t.stride() == first.stride() for t in inputs):
        return torch.empty_like(first)
    return torch.empty(first.shape, dtype=first.dtype, device=first.device)


def elementwise_rows(
    inputs: Sequence[torch.Tensor], n_outputs: int = 1
) -> tuple[list[Rows], list[Rows]]:
    """Plan an elementwise pass over same-shaped tensors: row views of the inputs and new outputs.

    Dense inputs with identical strides are walked flat, in storage order; anything else is
    walked as rows of the last dimension (an input with no such view is copied).
    """
    first = inputs[0]
    outs = [elementwise_output(inputs) for _ in range(n_outputs)]
    if all(is_dense(t) and t.stride() == first.stride() for t in inputs):
        return [flat_rows(t) for t in inputs], [flat_rows(o) for o in outs]
    n_cols = first.shape[-1] if first.dim() else 1
    return as_rows(inputs, n_cols), as_rows(outs, n_cols)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def prod(xs: Sequence[int]) -> int:
    return math.prod(xs)
