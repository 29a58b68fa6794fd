"""Run every kernel under Triton's CPU interpreter when there is no GPU.

TRITON_INTERPRET is read when a kernel is decorated, so it must be set before tritonkit's
kernel modules are imported; this file runs before any test module is imported.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def device() -> torch.device:
    return DEVICE
