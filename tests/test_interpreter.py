"""Under Triton's CPU interpreter, float32 rounds to bfloat16 as on the GPU (to nearest, ties to
even): ops/_core/interpreter.py replaces the interpreter's truncation. Without it, every CPU
check of a bfloat16 output measured the interpreter's rounding rather than the kernel's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tritonkit.ops._core import interpreter

pytestmark = pytest.mark.interpreter  # the interpreter's own numerics


@triton.jit
def _casts(x_ptr, stored_ptr, cast_ptr, rtz_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(stored_ptr + offs, x, mask=mask)  # the store's own conversion
    tl.store(cast_ptr + offs, x.to(tl.bfloat16), mask=mask)
    tl.store(rtz_ptr + offs, x.to(tl.bfloat16, fp_downcast_rounding="rtz"), mask=mask)


def _values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4000, generator=gen) * torch.logspace(-40, 38, 4000)
    special = [
        float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 3.3895e38, -3.3895e38,
        1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8), 1e-45, -1e-40,
    ]  # fmt: skip
    x[: len(special)] = torch.tensor(special)
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def test_installed():
    assert interpreter.ROUNDS_BF16


def test_casts_round_to_nearest_even_and_rtz_truncates():
    x = _values()
    outs = [torch.empty(x.shape, dtype=torch.bfloat16) for _ in range(3)]
    for out in outs:
        out.fill_(1.5)  # poisoned
    _casts[(1,)](x, *outs, x.numel(), BLOCK=4096)
    stored, cast, rtz = outs
    want = x.bfloat16()  # PyTorch rounds to nearest even, as the GPU's cvt.rn.bf16.f32
    nan = x.isnan()
    for got in (stored, cast):
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(_bits(got)[~nan], _bits(want)[~nan])
    truncated = (x.view(torch.int32) >> 16).to(torch.int16)
    finite = x.isfinite()
    assert torch.equal(_bits(rtz)[finite], truncated[finite])
    # the two modes differ where a value is not on the bfloat16 grid
    assert (_bits(rtz) != _bits(cast))[finite].any()


def test_rounding_helper_matches_torch():
    x = _values()
    got = interpreter.round_to_bfloat16(x.numpy())
    want = x.bfloat16().view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x.numpy())
    assert np.array_equal(got[~nan], want[~nan])
    assert torch.from_numpy(got.view(np.int16)).view(torch.bfloat16)[nan].isnan().all()


def test_numpy_warnings_stay_inside_interpreted_kernels():
    """Special values a GPU computes quietly (exp2 of -inf, inf - inf) make NumPy warn under
    the interpreter; none of those warnings reaches the caller, whose own NumPy settings are
    left as they were."""
    import warnings

    import tritonkit

    x = torch.randn(4, 37)
    x[0, 3], x[1, 2], x[2, 0] = float("inf"), float("nan"), -float("inf")
    x[3] = float("nan")  # a whole row: np.nanmax warns "All-NaN slice encountered"
    q = torch.randn(1, 2, 5, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tritonkit.softmax(x, dim=-1)
        tritonkit.rms_norm(x, (37,))
        tritonkit.gelu(x * 1e30)
        tritonkit.attention(q, q, q, is_causal=True)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], caught
    with pytest.warns(RuntimeWarning):
        np.exp2(np.float32(1000))  # the caller's NumPy still warns
