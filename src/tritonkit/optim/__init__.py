"""Fused optimizers, drop-in for ``torch.optim``: ``Adam``, ``AdamW``, ``Muon``, and ``MuonW``
(Muon on hidden matrices, AdamW on the rest; ``muon_param_groups`` splits a model that way)."""

from tritonkit.optim._base import NonFiniteGradError
from tritonkit.optim.adam import Adam, AdamW
from tritonkit.optim.muon import Muon, MuonW, muon_param_groups

__all__ = ["Adam", "AdamW", "Muon", "MuonW", "NonFiniteGradError", "muon_param_groups"]
