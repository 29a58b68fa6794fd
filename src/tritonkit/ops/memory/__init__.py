"""Memory-access patterns: a coalesced copy and a tiled transpose (with its naive strided
variant). Launcher: ``transpose_fwd`` (any dtype; the matmul family's layout copies use it)."""

from tritonkit.ops.memory.api import CopyFunction, TransposeFunction, copy, transpose
from tritonkit.ops.memory.transpose import STRIDED, TransposeConfig, transpose_fwd

__all__ = ["copy", "transpose"]
