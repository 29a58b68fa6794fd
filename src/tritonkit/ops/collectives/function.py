"""The public collectives (``tritonkit.dist`` re-exports them).

``all_reduce``, ``broadcast``, ``all_gather`` and ``reduce_scatter`` take torch.distributed's
arguments (process groups, NCCL for CUDA tensors, gloo for CPU tensors) plus a keyword-only
``timeout``; tritonkit's own paths are the ring all-reduce, the compressed all-reduce, the
symmetric-memory all-reduce and the fused all-reduce + residual add + RMSNorm. Every call
waits at most ``timeout`` (a ``datetime.timedelta`` or seconds) and raises
``CollectiveError`` naming the collective and the rank when a peer dies or never arrives.
The compressed all-reduce is also a DDP communication hook (``compressed_allreduce_hook``).
In debug mode (``set_debug(True)`` or ``TRITONKIT_DIST_DEBUG=1``) every call first checks
that all ranks passed the same shapes, dtypes and ops, and raises ValueError naming the rank
that differs (on gloo a monitored barrier first names a rank that never arrived).
``TRITONKIT_DIST_SYMM=0`` (set alike on every rank) keeps every call resolved after it off
symmetric memory: torch.distributed's collectives instead.
"""

import contextlib
import dataclasses
import datetime
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tritonkit.ops._core.internals import environ_get
from tritonkit.ops._core.plan import PLANS, current_env
from tritonkit.ops._core.validate import check_tensor
from tritonkit.ops.collectives import plan
from tritonkit.ops.collectives.config import CompressConfig, SymmConfig, symm_crossover
from tritonkit.ops.collectives.plan import (
    CollectiveError,
    as_timedelta,
    check_same_arguments,
    issue,
    wait_all,
)
from tritonkit.ops.collectives.plan import (
    signature as _signature,
)
from tritonkit.ops.matmul.launchers import matmul_fwd

Timeout = plan.Timeout
ReduceOp = dist.ReduceOp
ALGORITHMS = ("nccl", "ring", "symm", "auto")
CODE_DTYPES = (torch.int8, torch.float8_e4m3fn)
_debug = [os.environ.get("TRITONKIT_DIST_DEBUG", "0") not in ("", "0")]


def set_debug(enabled: bool) -> None:
    """Turn the debug mode on or off (every rank must agree: the check is a collective).

    Args:
        enabled: True to check, before every collective, that all ranks passed the same shapes,
            dtypes and ops (and, on gloo, that all arrived: a monitored barrier).
    """
    _debug[0] = bool(enabled)


@contextlib.contextmanager
def debug(enabled: bool = True) -> Iterator[None]:
    """The debug mode (see :func:`set_debug`) for the calls inside the ``with`` block.

    Args:
        enabled: the mode inside the block.
    """
    before = _debug[0]
    _debug[0] = bool(enabled)
    try:
        yield
    finally:
        _debug[0] = before


def _run(what: str, group, timeout: Timeout, async_op: bool, call) -> object:
    """Issue a torch.distributed collective asynchronously and wait for it within ``timeout``
    (an ``async_op`` call returns the work for the caller to wait on)."""
    work = plan.issue(call, as_timedelta(timeout), what, group)
    if async_op:
        return work
    wait_all([work], as_timedelta(timeout), what, group)
    return None


def all_reduce(
    tensor: torch.Tensor,
    op=ReduceOp.SUM,
    group=None,
    async_op: bool = False,
    *,
    timeout: Timeout = None,
    algorithm: str = "nccl",
):
    """Reduce ``tensor`` across the group's ranks, in place, as ``torch.distributed.all_reduce``.

    With ``algorithm="nccl"`` (the default) tritonkit adds nothing but the timeout and the
    debug check: it calls ``torch.distributed.all_reduce`` (NCCL for CUDA tensors, gloo for CPU
    ones). ``"ring"`` runs :func:`ring_all_reduce`; ``"symm"`` :func:`symm_all_reduce`;
    ``"auto"`` the symmetric-memory path below the message size measured for this GPU and world
    size (``tuned/<gpu>/collectives.json``), NCCL above it and where no size was measured.

    Args:
        tensor: the input and output of the collective, on every rank the same shape and dtype.
        op: a ``torch.distributed.ReduceOp`` (SUM, AVG, MAX, MIN, PRODUCT; symm: SUM, AVG).
        group: the process group (None: the default group).
        async_op: return the work instead of waiting (``algorithm="nccl"`` only; the caller
            then waits, and ``timeout`` applies to no wait).
        timeout: how long to wait (``datetime.timedelta`` or seconds; None: the group's).
        algorithm: "nccl", "ring", "symm" or "auto".

    Returns:
        None, or the work when ``async_op``.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"all_reduce: algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}"
        )
    if algorithm != "nccl" and async_op:
        raise ValueError(f"all_reduce: async_op=True needs algorithm='nccl', got {algorithm!r}")
    auto_key = None
    if algorithm == "auto" and isinstance(tensor, torch.Tensor) and not _debug[0]:
        # A key's choice is made once (availability and the crossover lookup cost more than a
        # launch): "nccl", or the symmetric-memory plan, launched from C at once. The key holds
        # what the choice reads: the message (numel, dtype), device, op, group and the switch.
        switch = environ_get("TRITONKIT_DIST_SYMM")
        auto_key = ("collectives.auto", group, tensor.numel(), tensor.dtype, tensor.device, op,
                    switch)  # fmt: skip
        chosen = PLANS.peek(auto_key, None)
        if isinstance(chosen, str):
            algorithm = chosen
        elif chosen is not None and tensor.is_contiguous() and chosen.launch.fast((tensor, tensor)):
            return None
    if algorithm == "auto":
        algorithm = _auto_algorithm(tensor, op, group)
        # Not a choice made while a CUDA graph is captured (NCCL then, whatever the size).
        if auto_key is not None and algorithm == "nccl" and not _capturing(tensor):
            PLANS.put(auto_key, None, "nccl")
    if algorithm == "ring":
        return ring_all_reduce(tensor, op, group, timeout=timeout)
    if algorithm == "symm":
        symm_all_reduce(tensor, op, group, timeout=timeout)
        if auto_key is not None and not _debug[0]:
            run = PLANS.peek(_symm_key(tensor, op, group), None)
            if run is not None:
                PLANS.put(auto_key, None, run)
        return None
    if _debug[0]:
        check_same_arguments("all_reduce", group, timeout, _signature(tensor, op=op))
    return _run(
        "all_reduce", group, timeout, async_op, lambda: dist.all_reduce(tensor, op, group, True)
    )


def _capturing(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def _auto_algorithm(tensor: torch.Tensor, op, group) -> str:
    if op not in (ReduceOp.SUM, ReduceOp.AVG) or plan.symm_unavailable(tensor, group):
        return "nccl"
    measured = symm_crossover(dist.get_world_size(group), tensor.dtype)
    if measured is None:
        return "nccl"
    return "symm" if tensor.numel() * tensor.element_size() <= measured[0] else "nccl"


def broadcast(
    tensor: torch.Tensor,
    src: int | None = None,
    group=None,
    async_op: bool = False,
    group_src: int | None = None,
    *,
    timeout: Timeout = None,
):
    """``torch.distributed.broadcast`` with a timeout and the debug check: tritonkit adds no
    algorithm of its own here (it calls torch.distributed).

    Args:
        tensor: sent from ``src``, received in place elsewhere.
        src: global rank of the source (or ``group_src``: its rank in ``group``).
        group: the process group (None: the default group).
        async_op: return the work instead of waiting.
        group_src: the source's rank in ``group``.
        timeout: how long to wait (``datetime.timedelta`` or seconds; None: the group's).
    """
    if _debug[0]:
        check_same_arguments(
            "broadcast", group, timeout, _signature(tensor, src=src, group_src=group_src)
        )
    kw = {"group_src": group_src} if group_src is not None else {}
    return _run(
        "broadcast", group, timeout, async_op,
        lambda: dist.broadcast(tensor, src, group, True, **kw),
    )  # fmt: skip


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group=None,
    async_op: bool = False,
    *,
    timeout: Timeout = None,
):
    """``torch.distributed.all_gather`` with a timeout and the debug check: tritonkit adds no
    algorithm of its own here (it calls torch.distributed).

    Args:
        tensor_list: one output tensor per rank, each of ``tensor``'s shape and dtype.
        tensor: this rank's contribution.
        group: the process group (None: the default group).
        async_op: return the work instead of waiting.
        timeout: how long to wait (``datetime.timedelta`` or seconds; None: the group's).
    """
    if _debug[0]:
        check_same_arguments("all_gather", group, timeout, _signature(tensor, *tensor_list))
    return _run(
        "all_gather", group, timeout, async_op,
        lambda: dist.all_gather(tensor_list, tensor, group, True),
    )  # fmt: skip


def reduce_scatter(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op=ReduceOp.SUM,
    group=None,
    async_op: bool = False,
    *,
    timeout: Timeout = None,
):
    """``torch.distributed.reduce_scatter`` with a timeout and the debug check: tritonkit adds
    no algorithm of its own here (it calls torch.distributed).

    Args:
        output: this rank's reduced piece.
        input_list: one tensor per rank, each of ``output``'s shape and dtype.
        op: a ``torch.distributed.ReduceOp``.
        group: the process group (None: the default group).
        async_op: return the work instead of waiting.
        timeout: how long to wait (``datetime.timedelta`` or seconds; None: the group's).
    """
    if _debug[0]:
        check_same_arguments(
            "reduce_scatter", group, timeout, _signature(output, *input_list, op=op)
        )
    return _run(
        "reduce_scatter", group, timeout, async_op,
        lambda: dist.reduce_scatter(output, list(input_list), op, group, True),
    )  # fmt: skip


def _check_float(op: str, name: str, t: object) -> None:
    """A float tensor on any device (the symmetric-memory paths fall back off CUDA)."""
    if isinstance(t, torch.Tensor) and t.device.type == "cuda":
        check_tensor(op, name, t)
    elif not isinstance(t, torch.Tensor) or t.dtype not in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
    ):
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{op}: {name} must be a float32, float16 or bfloat16 tensor, got {got}")


def _flat_work(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D tensor sharing ``tensor``'s memory when it can (else a copy)."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()


def ring_all_reduce(
    tensor: torch.Tensor, op=ReduceOp.SUM, group=None, *, timeout: Timeout = None
) -> None:
    """All-reduce ``tensor`` in place over a ring: a reduce-scatter then an all-gather, each
    ``world - 1`` point-to-point steps (``torch.distributed.batch_isend_irecv``), the
    reductions in a Triton kernel (in float32, rounded once a step to ``tensor``'s dtype).

    Results equal ``torch.distributed.all_reduce``'s where the sums are exact (integers in
    floating point, MAX, MIN); otherwise they differ only by the order of the additions.

    Args:
        tensor: float32, float16 or bfloat16, any layout (a non-contiguous one is copied).
        op: SUM, AVG, MAX, MIN or PRODUCT.
        group: the process group (None: the default group).
        timeout: how long each step may wait (``datetime.timedelta`` or seconds).
    """
    check_tensor("ring_all_reduce", "tensor", tensor)
    if op not in plan.REDUCE_CODES:
        raise ValueError(
            f"ring_all_reduce: op must be one of SUM, AVG, MAX, MIN, PRODUCT, got {op}"
        )
    if _debug[0]:
        check_same_arguments("ring_all_reduce", group, timeout, _signature(tensor, op=op))
    flat = _flat_work(tensor)
    plan.ring_all_reduce(flat, op, group, as_timedelta(timeout))
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))


def compressed_all_reduce(
    tensor: torch.Tensor,
    op=ReduceOp.SUM,
    group=None,
    *,
    dtype: torch.dtype = torch.int8,
    residual: torch.Tensor | None = None,
    block: int | None = None,
    timeout: Timeout = None,
    algorithm: str = "auto",
) -> int:
    """All-reduce ``tensor`` in place through block-wise ``dtype`` codes (a float32 scale per
    ``block`` elements): quantize (adding ``residual``, the error feedback), all-to-all of the
    compressed chunks, one kernel that dequantizes the world's chunks of this rank's shard,
    sums them in float32 and requantizes, all-gather of the compressed shards, dequantize.

    On CUDA tensors of an NCCL group with int8 codes (``algorithm="auto"`` or ``"symm"``) the
    exchanges are stores into the peers' symmetric buffers instead (no collective call: three
    kernels, two barriers; the same arithmetic). Bytes per rank, either way: ``2 (world - 1)
    shard (1 + 4 / block)`` with ``shard = numel / world`` rounded up to whole blocks, against
    ``2 (world - 1) / world * numel * element_size`` for NCCL's ring all-reduce.

    Bound (int8, per block of ``block`` elements, without error feedback): ``|out - exact| <=
    (sum_r amax_r + amax_sum) / 254`` plus the output dtype's rounding, where ``amax_r`` is rank
    r's largest magnitude in the block and ``amax_sum`` that of the dequantized sum (<=
    ``sum_r amax_r * (1 + 1/254)``). For float8 e4m3 the codes carry a relative error of 2^-4:
    ``|out - exact| <= (sum_r amax_r + amax_sum) / 16``. Every rank gets the same values.

    Args:
        tensor: float32, float16 or bfloat16, in place (a non-contiguous one is copied).
        op: SUM or AVG.
        group: the process group (None: the default group).
        dtype: the codes: torch.int8 or torch.float8_e4m3fn.
        residual: error-feedback state of ``residual_size(tensor.numel(), world)`` elements,
            float32 or ``tensor``'s dtype, read and updated (the first ``padded`` elements this
            rank's quantization residual, the rest its shard's requantization residual), or
            None for none. The arithmetic is float32 either way; a bfloat16 state rounds the
            residual (at most 1/254 of a block's largest magnitude) to 8 bits and moves 4 of
            the 8 bytes per element (read and written) a float32 state costs the quantize
            kernel.
        block: elements per scale (None: the config's heuristic).
        timeout: how long each exchange may wait (``datetime.timedelta`` or seconds; the
            symmetric-memory path's barriers wait for every peer).
        algorithm: "auto" (symmetric memory where it runs, else torch.distributed's
            all-to-all and all-gather), "symm" (the same, saying so once when it falls back)
            or "nccl" (torch.distributed's exchanges: NCCL or gloo).

    Returns:
        The bytes this rank sent (on symmetric memory: stored into the peers' buffers).
    """
    key = None
    if isinstance(tensor, torch.Tensor) and not _debug[0]:
        # A call like an earlier one (the same key: everything its validation and its kernel
        # depend on) reuses that call's plan: one launch, no setup.
        res_key = (residual.dtype, residual.numel()) if isinstance(residual, torch.Tensor) else 0
        key = ("collectives.compressed", group, tensor.numel(), tensor.dtype, tensor.device, op,
               dtype, block, algorithm, res_key)  # fmt: skip
        run = PLANS.peek(key, current_env())
        if (
            run is not None
            and tensor.is_contiguous()
            and (residual is None or residual.is_contiguous())
            and not (tensor.is_cuda and torch.cuda.is_current_stream_capturing())
        ):
            return run(tensor, tensor, residual)
    check_tensor("compressed_all_reduce", "tensor", tensor)
    if op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise ValueError(f"compressed_all_reduce: op must be SUM or AVG, got {op}")
    if algorithm not in SYMM_CHOICES:
        raise ValueError(
            f"compressed_all_reduce: algorithm must be one of {list(SYMM_CHOICES)}, "
            f"got {algorithm!r}"
        )
    if dtype not in CODE_DTYPES:
        raise TypeError(f"compressed_all_reduce: dtype must be int8 or float8_e4m3fn, got {dtype}")
    res_dtype = residual.dtype if isinstance(residual, torch.Tensor) else None
    cfg = CompressConfig.heuristic(tensor.numel(), dtype, res_dtype)
    if block is not None:
        if block < 16 or block & (block - 1):
            raise ValueError(
                f"compressed_all_reduce: block must be a power of 2 >= 16, got {block}"
            )
        cfg = dataclasses.replace(cfg, block=block)
    if _debug[0]:
        check_same_arguments("compressed_all_reduce", group, timeout, _signature(tensor, op=op))
    world = dist.get_world_size(group)
    lay = plan.CompressedLayout.of(tensor.numel(), world, cfg)
    worker_res = server_res = None
    if residual is not None:
        need = lay.padded + lay.shard
        if (
            residual.dtype not in (torch.float32, tensor.dtype)
            or residual.numel() != need
            or not residual.is_contiguous()
        ):
            raise ValueError(
                f"compressed_all_reduce: residual must be a contiguous float32 tensor (or "
                f"one of the tensor's dtype, {tensor.dtype}) of {need} elements, got "
                f"{residual.dtype} with {residual.numel()}"
            )
        worker_res, server_res = residual[: lay.padded], residual[lay.padded :]
    if tensor.numel() == 0:
        return 0
    flat = _flat_work(tensor)
    ws = _compress_workspace(tensor, group, cfg, lay, algorithm)
    if ws is not None:
        run = PLANS.peek(key, current_env()) if key is not None else None
        if run is None or run.ws is not ws:  # new, or its workspace grew: the plan moves to it
            run = plan.CompressedSymm(ws, tensor.numel(), cfg, res_dtype is not None,
                                      op == ReduceOp.AVG)  # fmt: skip
            if key is not None:
                PLANS.put(key, current_env(), run)
        sent = run(flat, flat, residual)
    else:
        sent = plan.compressed_all_reduce_flat(
            flat, flat, group, cfg, worker_res, server_res, op == ReduceOp.AVG,
            as_timedelta(timeout),
        )  # fmt: skip
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
    return sent


# The paths of the calls that run on symmetric memory where it can (else torch.distributed).
SYMM_CHOICES = ("auto", "symm", "nccl")


def _compress_workspace(tensor, group, cfg, lay, algorithm: str):
    """The symmetric workspace the compressed all-reduce runs on, or None (torch.distributed's
    exchanges)."""
    if algorithm == "nccl":
        return None
    why = plan.symm_unavailable(tensor, group)
    if why is None and cfg.dtype != torch.int8:
        why = f"its symmetric-memory path takes int8 codes, not {cfg.dtype}"
    if why is None:
        try:
            aligned = plan.CompressedLayout.of(lay.numel, lay.world, cfg, align=16)
            nbytes, _ = plan.symm_compress_layout(aligned)
            return plan.workspace(group, tensor.device, torch.uint8, nbytes)
        except (RuntimeError, ImportError) as exc:
            why = f"symmetric memory could not be allocated ({exc})"
    if algorithm == "symm":
        _fallback("compressed_all_reduce", why, "its all-to-all and all-gather")
    return None


def residual_size(numel: int, world: int, block: int | None = None) -> int:
    """Elements of the error-feedback state :func:`compressed_all_reduce` takes for a tensor of
    ``numel`` elements over ``world`` ranks.

    Args:
        numel: the tensor's elements.
        world: the group's size.
        block: elements per scale (None: the default).
    """
    cfg = CompressConfig.heuristic(numel) if block is None else CompressConfig(block=block)
    lay = plan.CompressedLayout.of(numel, world, cfg)
    return lay.padded + lay.shard


_said_fallback: set[tuple[str, str]] = set()


def _fallback(op: str, why: str, instead: str = "all_reduce") -> None:
    if (op, why) not in _said_fallback:  # once per function, reason and process
        _said_fallback.add((op, why))
        msg = f"tritonkit.dist.{op}: {why}; using torch.distributed's {instead} instead"
        warnings.warn(msg, stacklevel=3)


# ("collectives.symm", group, numel, dtype, device, op) -> the resolved all-reduce
# (plan.SymmAllReduce), in the one plan cache (without the Env: see symm_all_reduce): every
# later call of that key is a lookup, a check and one C call that launches (native_launch).
# Validated on the first call (a key holds only a CUDA float tensor's dtype and device); kept
# only outside debug mode.


def _symm_key(tensor: torch.Tensor, op, group) -> tuple:
    return ("collectives.symm", group, tensor.numel(), tensor.dtype, tensor.device, op)


def symm_all_reduce(
    tensor: torch.Tensor, op=ReduceOp.SUM, group=None, *, timeout: Timeout = None
) -> None:
    """All-reduce ``tensor`` in place through symmetric memory: one Triton kernel copies it into
    this rank's symmetric buffer, meets the peers at a barrier of signal pads, and reads every
    peer's buffer (one-shot: all of it; two-shot, above a size: its part, writing the reduced
    part into every peer's buffer), summing in float32 and rounding once.

    The buffer, its peer-pointer and signal-pad tables, the config and the compiled launch are
    resolved on the first call of a (group, numel, dtype, device, op) and reused after: no
    rendezvous and no table lookup per call.

    Where symmetric memory is unavailable (CPU tensors, a non-NCCL group, a build without it)
    it says so once (a warning) and calls ``torch.distributed.all_reduce``.

    Args:
        tensor: float32, float16 or bfloat16 CUDA tensor, the same shape on every rank.
        op: SUM or AVG.
        group: the process group (None: the default group).
        timeout: bounds the NCCL fallback's wait; the kernel's barrier waits for every peer.
    """
    if isinstance(tensor, torch.Tensor) and not _debug[0]:
        # Keyed without the Env snapshot (a few microseconds a call): nothing in it changes
        # this kernel's answer (one-shot and two-shot both sum the ranks in order in float32
        # and round once), and the key holds the tensor's device.
        key = ("collectives.symm", group, tensor.numel(), tensor.dtype, tensor.device, op)
        run = PLANS.peek(key, None)  # _symm_key's key, built here without the call
        if run is not None and tensor.is_contiguous():
            # From C where it applies (it refuses while a CUDA graph is captured), else
            # through Triton's launcher where no graph is captured.
            if run.launch.fast((tensor, tensor)):
                return None
            if not (tensor.is_cuda and torch.cuda.is_current_stream_capturing()):
                run(tensor, tensor)
                return None
    _check_float("symm_all_reduce", "tensor", tensor)
    if op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise ValueError(f"symm_all_reduce: op must be SUM or AVG, got {op}")
    why = plan.symm_unavailable(tensor, group)
    if why is None:
        try:
            ws = plan.workspace(group, tensor.device, tensor.dtype, tensor.numel())
        except (RuntimeError, ImportError) as exc:
            why = f"symmetric memory could not be allocated ({exc})"
    if why is not None:
        _fallback("symm_all_reduce", why)
        return all_reduce(tensor, op, group, timeout=timeout)
    if _debug[0]:
        check_same_arguments("symm_all_reduce", group, timeout, _signature(tensor, op=op))
    if tensor.numel() == 0:
        return None
    run = _symm_plan(tensor, op, group, ws)
    flat = _flat_work(tensor)
    run(flat, flat)
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
    return None


def all_gather_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    group=None,
    *,
    timeout: Timeout = None,
    algorithm: str = "auto",
) -> torch.Tensor:
    """``torch.cat(all_gather(a), dim=0) @ b``: the ranks' row shards of ``a`` gathered in rank
    order, times ``b`` (a tensor-parallel column-parallel linear's input gather and product).

    On CUDA tensors of an NCCL group (``algorithm`` "auto" or "symm") the gather overlaps the
    product: the copy engines store ``a`` into every peer's symmetric buffer on a side stream
    while this rank's own rows are multiplied (``tritonkit.matmul``'s kernels), then the peers'
    rows are. Elsewhere (``"nccl"``, CPU tensors, gloo): torch.distributed's all-gather, then
    ``tritonkit.matmul``; "symm" says so once when it falls back.

    Args:
        a: (m, k) float32, float16 or bfloat16: this rank's shard, the same shape on every rank.
        b: (k, n), of ``a``'s dtype and device.
        group: the process group (None: the default group).
        timeout: bounds the all-gather's wait (the symmetric-memory path's barrier waits for
            every peer).
        algorithm: "auto", "symm" or "nccl".

    Returns:
        The (world * m, n) product.
    """
    op = "all_gather_matmul"
    _check_float(op, "a", a)
    if not isinstance(b, torch.Tensor) or b.dtype != a.dtype or b.device != a.device:
        got = f"{b.dtype} on {b.device}" if isinstance(b, torch.Tensor) else type(b).__name__
        raise TypeError(f"{op}: b must be a tensor of a's dtype and device, got {got}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{op}: a must be (m, k) and b (k, n), got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if algorithm not in SYMM_CHOICES:
        raise ValueError(f"{op}: algorithm must be one of {list(SYMM_CHOICES)}, got {algorithm!r}")
    if _debug[0]:
        check_same_arguments(op, group, timeout, _signature(a, b))
    world = dist.get_world_size(group)
    why = "algorithm='nccl'" if algorithm == "nccl" else plan.symm_unavailable(a, group)
    if why is None and a.numel() == 0:
        why = "an empty shard"
    if why is None:
        try:
            ws = plan.workspace(group, a.device, a.dtype, world * a.numel())
        except (RuntimeError, ImportError) as exc:
            why = f"symmetric memory could not be allocated ({exc})"
    if why is None:
        return plan.all_gather_matmul_symm(a.contiguous(), b, ws)
    if algorithm == "symm":
        _fallback(op, why, "all_gather then matmul")
    parts = [torch.empty(a.shape, dtype=a.dtype, device=a.device) for _ in range(world)]
    all_gather(parts, a.contiguous(), group, timeout=timeout)
    return matmul_fwd(torch.cat(parts), b)


def _symm_plan(tensor: torch.Tensor, op, group, ws) -> "plan.SymmAllReduce":
    """The cached all-reduce of ``tensor``'s key (made, and cached outside debug mode)."""
    key = _symm_key(tensor, op, group)
    run = PLANS.peek(key, None)  # no Env: see symm_all_reduce
    if run is None or run.ws is not ws:  # a grown workspace: the plan moves to it
        measured = symm_crossover(ws.world, tensor.dtype)
        one_max = measured[1] if measured else SymmConfig.default_one_shot_max_bytes(ws.world)
        cfg = SymmConfig.heuristic(tensor.numel() * tensor.element_size(), ws.world, one_max)
        alpha = 1.0 / ws.world if op == ReduceOp.AVG else 1.0
        run = plan.SymmAllReduce(ws, tensor.numel(), cfg, alpha)
        if not _debug[0]:
            PLANS.put(key, None, run)
    return run


def fused_all_reduce_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float | None = None,
    group=None,
    *,
    timeout: Timeout = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = all_reduce(x) + residual; (rms_norm(h) * weight, h)`` in one kernel over symmetric
    memory: the tensor-parallel block's epilogue (TensorRT-LLM's fused all-reduce). The ranks'
    terms are summed in float32 in rank order and rounded once to x's dtype, then rounded as
    :func:`tritonkit.add_rms_norm`: the bits of NCCL's all-reduce followed by add_rms_norm at 2
    ranks; from 3 ranks on NCCL's ring rounds each hop's partial sum (in half precision, an
    ulp of the sum apart in places), this rounds once.

    Where symmetric memory is unavailable it says so once and runs NCCL's all-reduce then
    ``tritonkit.add_rms_norm`` (on CPU tensors: torch's all_reduce and the same formula in
    float32, without the interpreter's norm kernel).

    Args:
        x: this rank's partial sums, (..., hidden), float32/float16/bfloat16, contiguous.
        residual: the residual stream, x's shape and dtype.
        weight: (hidden,) scale, or None.
        eps: added to the mean square (None: float32's machine epsilon, as add_rms_norm).
        group: the process group (None: the default group).
        timeout: bounds the fallback's wait.

    Returns:
        ``(normalized, new_residual)``.
    """
    op = "fused_all_reduce_add_rms_norm"
    _check_float(op, "x", x)
    if (
        not isinstance(residual, torch.Tensor)
        or residual.shape != x.shape
        or residual.dtype != x.dtype
    ):
        got = (
            (tuple(residual.shape), residual.dtype)
            if isinstance(residual, torch.Tensor)
            else type(residual)
        )
        raise ValueError(f"{op}: residual must match x ({tuple(x.shape)}, {x.dtype}), got {got}")
    if weight is not None and tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(
            f"{op}: weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}"
        )
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    why = plan.symm_unavailable(x, group)
    if why is None:
        try:
            ws = plan.workspace(group, x.device, x.dtype, x.numel())
        except (RuntimeError, ImportError) as exc:
            why = f"symmetric memory could not be allocated ({exc})"
    if why is not None:
        _fallback(op, why)
        reduced = x.clone()
        all_reduce(reduced, group=group, timeout=timeout)
        return plan.add_rms_norm_reference(reduced, residual, weight, eps)
    if _debug[0]:
        check_same_arguments(op, group, timeout, _signature(x, residual))
    return plan.fused_norm_launch(x.contiguous(), residual.contiguous(), weight, eps, ws)


# ----------------------------------------------------------------------------------------------
# The DDP communication hook: error feedback per bucket, bytes counted


@dataclass
class CompressionState:
    """State of :func:`compressed_allreduce_hook` (``DistributedDataParallel.register_comm_hook
    (state, hook)``).

    ``dtype=None`` all-reduces uncompressed (the baseline, counted the same way). Bytes are
    counted per rank: ``bytes_sent`` what this hook sent, ``bytes_uncompressed`` what a ring
    all-reduce of the same buckets in their own dtype sends (``2 (world - 1) / world`` of them,
    as NCCL's ring does).
    """

    group: object = None
    dtype: torch.dtype | None = torch.int8
    error_feedback: bool = True
    block: int | None = None
    timeout: datetime.timedelta | float | None = None
    residuals: dict[int, torch.Tensor] = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_uncompressed: int = 0

    def compression_ratio(self) -> float:
        """Uncompressed bytes over the bytes sent."""
        return self.bytes_uncompressed / max(1, self.bytes_sent)


def _residual(state: CompressionState, index: int, buf: torch.Tensor, world: int) -> torch.Tensor:
    need = residual_size(buf.numel(), world, state.block)
    res = state.residuals.get(index)
    # DDP rebuilds its buckets after the first step: a bucket whose size changed starts over.
    if res is None or res.numel() != need or res.device != buf.device:
        res = torch.zeros(need, dtype=torch.float32, device=buf.device)
        state.residuals[index] = res
    return res


def compressed_allreduce_hook(
    state: CompressionState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP gradient bucket through :func:`tritonkit.dist.compressed_all_reduce`
    (int8 or float8 codes, error feedback kept per bucket index).

    Args:
        state: a :class:`CompressionState` (counts bytes, holds the residuals).
        bucket: the bucket DDP passes.

    Returns:
        A completed future of the averaged bucket.
    """
    buf = bucket.buffer()
    world = dist.get_world_size(state.group)
    nbytes = buf.numel() * buf.element_size()
    state.bytes_uncompressed += 2 * (world - 1) * nbytes // world
    if state.dtype is None:
        timeout = as_timedelta(state.timeout)
        call = lambda: dist.all_reduce(buf, group=state.group, async_op=True)  # noqa: E731
        wait_all([issue(call, timeout, "allreduce_hook", state.group)], timeout, "allreduce_hook")
        buf.div_(world)
        state.bytes_sent += 2 * (world - 1) * nbytes // world
    else:
        res = _residual(state, bucket.index(), buf, world) if state.error_feedback else None
        state.bytes_sent += compressed_all_reduce(
            buf, dist.ReduceOp.AVG, state.group, dtype=state.dtype, residual=res,
            block=state.block, timeout=state.timeout,
        )  # fmt: skip
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


def register_compression(model, state: CompressionState | None = None) -> CompressionState:
    """Register :func:`compressed_allreduce_hook` on a DistributedDataParallel ``model``.

    Args:
        model: a ``torch.nn.parallel.DistributedDataParallel``.
        state: the hook's state (None: int8 with error feedback on the model's group).

    Returns:
        The state (read its ``bytes_sent`` / ``bytes_uncompressed``).
    """
    state = state or CompressionState(group=getattr(model, "process_group", None))
    model.register_comm_hook(state, compressed_allreduce_hook)
    return state


__all__ = [
    "CollectiveError",
    "CompressionState",
    "ReduceOp",
    "all_gather",
    "all_gather_matmul",
    "all_reduce",
    "broadcast",
    "compressed_all_reduce",
    "compressed_allreduce_hook",
    "debug",
    "fused_all_reduce_add_rms_norm",
    "reduce_scatter",
    "register_compression",
    "residual_size",
    "ring_all_reduce",
    "set_debug",
    "symm_all_reduce",
]
