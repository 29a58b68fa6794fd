"""Baselines that only time on a GPU still get called on the CPU here: a baseline that raises is
a column of "—" in the main job's report, and nothing else notices (the SDPA backends did, from
a keyword-only argument passed by position)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tritonkit.specs.attention import _sdpa_backend

from _checks import DEVICE


def test_sdpa_backend_baseline_takes_the_specs_arguments():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 16, device=DEVICE) for _ in range(3))
    run = _sdpa_backend("MATH")()  # the baselines' wrapper, on the one backend the CPU has
    out = run(q, k, v, None, 0.0, True, 0.25)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
    torch.testing.assert_close(out, ref)
    kv = (torch.randn(2, 1, 17, 16, device=DEVICE) for _ in range(2))
    k1, v1 = kv
    out = run(q, k1, v1, None, 0.0, False, None, enable_gqa=True, window=(4, 0))
    assert out.shape == q.shape and torch.isfinite(out).all()
