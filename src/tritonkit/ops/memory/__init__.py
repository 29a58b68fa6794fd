"""Memory-access patterns: a coalesced copy and a tiled transpose (with its naive strided
variant). Launcher: ``transpose_fwd`` (any dtype; the matmul family's layout copies use it)."""

from tritonkit.ops.memory.config import STRIDED, TransposeConfig
from tritonkit.ops.memory.function import CopyFunction, TransposeFunction, copy, transpose
from tritonkit.ops.memory.plan import transpose_fwd

__all__ = ["copy", "transpose"]
