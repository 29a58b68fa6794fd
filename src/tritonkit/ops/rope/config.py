"""What a launch of the rope kernel can tune, and its heuristic."""

from dataclasses import dataclass

# Warps per program: about 4K elements of x per program (see for_head_dim) at every head dim.
ROPE_WARPS = 4


@dataclass(frozen=True)
class RopeConfig:
    """What a launch of the rope kernel can tune (at ``ROPE_WARPS`` warps)."""

    block_t: int = 16  # positions per program

    @classmethod
    def for_head_dim(cls, head_dim: int) -> "RopeConfig":
        # About 4K elements of x per program whatever the head dim (a power of 2 positions).
        rows = max(1, min(64, 4096 // max(1, head_dim)))
        return cls(block_t=1 << (rows.bit_length() - 1))
