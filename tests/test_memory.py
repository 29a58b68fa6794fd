"""Memory-access family: copy and transpose (tiled, and the strided variant)."""

import pytest
import torch

import tritonkit
from tritonkit.ops._core.layout import LAYOUT_COPIES
from tritonkit.ops.memory import STRIDED, TransposeConfig, transpose_fwd

from _checks import assert_spec_passes


@pytest.mark.slow
@pytest.mark.parametrize("name", ["copy", "transpose"])
def test_check_engine_passes(name, device):
    assert_spec_passes(name, device)


@pytest.mark.parametrize(
    "config", [STRIDED, TransposeConfig(16, 32, 4)], ids=["strided", "tiled16x32"]
)
@pytest.mark.parametrize("shape", [(1, 1), (17, 33), (3, 40, 9)])
def test_transpose_variants_agree(config, shape, device):
    x = torch.randn(shape, device=device)
    assert torch.equal(transpose_fwd(x, config), x.transpose(-2, -1).contiguous())


def test_transpose_reads_any_strides_without_copy(device):
    x = torch.randn(4, 30, 20, device=device).transpose(-1, -2)[:, 3:, :]
    LAYOUT_COPIES.reset()
    out = tritonkit.transpose(x)
    assert LAYOUT_COPIES.reset() == 0
    assert out.is_contiguous()
    assert torch.equal(out, x.transpose(-2, -1).contiguous())


def test_transpose_batch_dims_without_common_stride_are_copied(device):
    x = torch.randn(4, 6, 5, 3, device=device).permute(1, 0, 2, 3)
    LAYOUT_COPIES.reset()
    out = tritonkit.transpose(x)
    assert LAYOUT_COPIES.reset() == 1
    assert torch.equal(out, x.transpose(-2, -1).contiguous())


def test_transpose_needs_two_dims(device):
    with pytest.raises(ValueError, match=r"x must have at least 2 dimensions, got shape \(5,\)"):
        tritonkit.transpose(torch.randn(5, device=device))


def test_copy_is_a_new_tensor_with_clone_strides(device):
    x = torch.randn(8, 6, device=device).t()
    out = tritonkit.copy(x)
    assert out.data_ptr() != x.data_ptr()
    assert out.stride() == x.clone().stride()
    assert torch.equal(out, x)


def test_copy_rejects_integer_tensors(device):
    with pytest.raises(TypeError, match=r"tritonkit\.copy: x must have dtype"):
        tritonkit.copy(torch.arange(4, device=device))
