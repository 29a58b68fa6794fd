"""Operator specs, one module per family; importing this package registers them all."""

from tritonkit.specs import elementwise, memory  # noqa: F401
