"""Collectives on torch.distributed: the ring all-reduce (reductions in Triton), the compressed
all-reduce (int8/float8 codes with per-block scales and error feedback, and its DDP hook), the
symmetric-memory one-shot/two-shot all-reduce and the fused all-reduce + residual add + RMSNorm.

``kernels.py``: the Triton kernels; ``config.py``: their frozen configs and the measured
symmetric-memory crossover; ``plan.py``: the launchers and the wait with a timeout;
``function.py``: the public functions and the DDP communication hook. The public
package is ``tritonkit.dist``; no flat function of this family is exported through
``tritonkit.functional`` (their names would shadow nothing, but they take process groups).
"""

__all__: list[str] = []
