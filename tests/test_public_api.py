"""Every public function, once, in the fast tier: its spec's check at one small shape.

The family tests go deeper (every shape, dtype, layout and path; many are marked ``slow``);
this file makes sure ``pytest -m "not slow"`` still calls each function of ``tritonkit.__all__``
forward and backward, and that each has a spec (``tritonkit check`` sees it).
"""

import pytest
import torch

from tritonkit import functional
from tritonkit.harness.spec import all_specs
from tritonkit.ops._core.device import interpreter_enabled

from _checks import assert_spec_passes


def _spec_of(name):
    fn = getattr(functional, name)
    for spec in all_specs():
        if spec.name == name or spec.impl is fn:
            return spec
    return None


@pytest.mark.parametrize("name", functional.__all__)
def test_public_function_passes_one_check(name, device):
    spec = _spec_of(name)
    assert spec is not None, f"tritonkit.{name} has no OpSpec (by its name or as its impl)"
    usable = [d for d in spec.dtypes if not (interpreter_enabled() and d in spec.interpreter_skip)]
    dtype = torch.float32 if torch.float32 in usable else usable[0]
    assert_spec_passes(
        spec.name, device, shapes=[spec.shapes.test[0]], dtypes=[dtype], cases=("random", "grad")
    )
