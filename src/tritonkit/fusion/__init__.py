"""A fusion planner on FX graphs: which groups of operations one kernel should compute,
whether fusing pays (a cost model from bytes, launches and the roofline), the fused form
(tritonkit's fused operators for known patterns, generated Triton kernels for elementwise
chains) and an explanation with predicted and measured savings.

``plan(module, example_inputs)`` -> :class:`FusionPlan` (``measure``, ``explain``,
``apply``); ``validate`` runs the cost model against measurements over a set of patterns.
"""

from tritonkit.fusion.analyzer import FusionAnalyzer, FusionGroup
from tritonkit.fusion.codegen import generate
from tritonkit.fusion.cost import CostParams, Estimate, FusionCostModel
from tritonkit.fusion.planner import FusionPlan, plan
from tritonkit.fusion.validate import PATTERNS, validate

__all__ = [
    "PATTERNS",
    "CostParams",
    "Estimate",
    "FusionAnalyzer",
    "FusionCostModel",
    "FusionGroup",
    "FusionPlan",
    "generate",
    "plan",
    "validate",
]
