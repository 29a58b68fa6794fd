"""What a gated-unit launch can tune: the shared pointwise tiles (``_core.pointwise_config``),
with the vectors per thread its activation and direction take."""

from tritonkit.ops._core.pointwise_config import POINTWISE, PointwiseConfig, TileConfig


def glu_tiles(
    n_rows: int,
    n_cols: int,
    elem: int,
    activation: str,
    backward: bool,
    config: PointwiseConfig = POINTWISE,
) -> TileConfig:
    """The tile of a GLU launch over ``n_rows`` x ``n_cols`` elements of ``elem`` bytes: the
    forward as the heavy pointwise ops (an activation and a product per element), the backward
    by its activation's cost (``PointwiseConfig.bwd_vectors_for``)."""
    vectors = config.bwd_vectors_for(activation, elem) if backward else config.heavy_vectors
    return TileConfig.for_rows(n_rows, n_cols, elem, config, vectors)
