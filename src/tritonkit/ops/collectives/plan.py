"""Launchers of the collectives: the ring all-reduce over point-to-point sends, the compressed
all-reduce's pipeline, the symmetric-memory workspaces and their kernels, and the wait with a
timeout every collective ends in."""

from __future__ import annotations

import datetime
import math
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tritonkit.ops._core import launch as _L
from tritonkit.ops._core import native_launch
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.internals import cuda_device
from tritonkit.ops._core.layout import cdiv, next_power_of_2
from tritonkit.ops._core.plan import PLANS, current_env
from tritonkit.ops.collectives import kernels as K
from tritonkit.ops.collectives.config import (
    CompressConfig,
    FusedNormConfig,
    RingConfig,
    SymmConfig,
)
from tritonkit.ops.matmul.launchers import matmul_into
from tritonkit.ops.quant.config import get_format
from tritonkit.ops.quant.plan import dequantize_2d

Timeout = datetime.timedelta | float | None


class CollectiveError(RuntimeError):
    """A collective that did not complete: a peer died, never arrived or timed out."""


def as_timedelta(timeout: datetime.timedelta | float | None) -> datetime.timedelta | None:
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    return datetime.timedelta(seconds=float(timeout))


def issue(call, timeout: datetime.timedelta | None, what: str, group=None):
    """``call()`` (issuing collectives), a failure at issue raised as CollectiveError (gloo
    reports a peer that already died there)."""
    try:
        return call()
    except Exception as exc:
        raise _error(what, timeout, group, exc) from exc


def wait_all(works, timeout: datetime.timedelta | None, what: str, group=None) -> None:
    """Wait for every ``work`` (a torch.distributed Work) within ``timeout``; a failure or an
    expiry raises CollectiveError naming the collective, this rank and the time allowed."""
    for work in works:
        if work is None:
            continue
        try:
            ok = work.wait(timeout) if timeout is not None else work.wait()
        except Exception as exc:  # gloo: a closed connection or its own timeout
            raise _error(what, timeout, group, exc) from exc
        if ok is False:
            raise _error(what, timeout, group, None)


def _error(what: str, timeout, group, exc) -> CollectiveError:
    rank = dist.get_rank(group) if dist.is_initialized() else -1
    limit = f"within {timeout.total_seconds():g} s" if timeout is not None else ""
    why = f": {type(exc).__name__}: {exc}" if exc is not None else ""
    return CollectiveError(
        f"tritonkit.dist.{what}: rank {rank} did not complete {limit} (a peer rank died, "
        f"never arrived, or passed different arguments){why}"
    )


def group_ranks(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def global_rank(group, rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


# ----------------------------------------------------------------------------------------------
# The debug mode's check


def signature(*tensors: torch.Tensor, **extra: object) -> tuple:
    return tuple((tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors) + tuple(
        sorted((k, str(v)) for k, v in extra.items())
    )


def check_same_arguments(what: str, group, timeout: Timeout, signature: tuple) -> None:
    """Raise ValueError on every rank, naming the ranks whose ``signature`` differs from rank
    0's (on gloo, a monitored barrier first names a rank that never arrived)."""
    td = as_timedelta(timeout) if timeout is not None else None
    if dist.get_backend(group) == "gloo":
        try:
            dist.monitored_barrier(group, timeout=td, wait_all_ranks=True)
        except RuntimeError as exc:
            raise CollectiveError(f"tritonkit.dist.{what}: {exc}") from exc
    world = dist.get_world_size(group)
    got: list[object] = [None] * world
    dist.all_gather_object(got, signature, group=group)
    bad = [r for r in range(world) if got[r] != got[0]]
    if bad:
        shown = "; ".join(f"rank {r} passed {_show(got[r])}" for r in bad)
        raise ValueError(
            f"tritonkit.dist.{what}: ranks disagree: {shown}, where rank 0 passed {_show(got[0])}"
        )


def _show(sig) -> str:
    parts = []
    for item in sig:
        if isinstance(item[0], tuple):
            parts.append(f"shape {item[0]} {item[1]}")
        else:
            parts.append(f"{item[0]}={item[1]}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------
# Ring all-reduce


REDUCE_CODES = {
    dist.ReduceOp.SUM: K.OP_SUM.value,
    dist.ReduceOp.AVG: K.OP_SUM.value,
    dist.ReduceOp.MAX: K.OP_MAX.value,
    dist.ReduceOp.MIN: K.OP_MIN.value,
    dist.ReduceOp.PRODUCT: K.OP_PROD.value,
}


def ring_reduce(acc: torch.Tensor, x: torch.Tensor, op_code: int, alpha: float) -> None:
    """``acc = op(acc, x) * alpha`` elementwise, in float32, in place (both flat, contiguous)."""
    n = acc.numel()
    if n == 0:
        return
    cfg = RingConfig.heuristic(n)
    K._ring_reduce_kernel[(cdiv(n, cfg.block),)](
        acc, x, n, alpha, OP=op_code, BLOCK=cfg.block, num_warps=cfg.num_warps
    )


def ring_all_reduce(flat: torch.Tensor, op, group, timeout: datetime.timedelta | None) -> None:
    """All-reduce ``flat`` (contiguous, 1-D) in place: a reduce-scatter then an all-gather over
    the ring, ``world - 1`` steps each, every step one send to the right neighbour and one
    receive from the left (``batch_isend_irecv``), the reductions in ``_ring_reduce_kernel``."""
    rank, world = group_ranks(group)
    if world == 1:  # the reduction of one value is the value (an average too)
        return
    chunks = list(torch.tensor_split(flat, world))
    recv = torch.empty(max(c.numel() for c in chunks), dtype=flat.dtype, device=flat.device)
    right = global_rank(group, (rank + 1) % world)
    left = global_rank(group, (rank - 1) % world)
    op_code = REDUCE_CODES[op]

    def exchange(send: torch.Tensor, into: torch.Tensor) -> None:
        # What a rank sends is the chunk its right neighbour receives (one split on every
        # rank): an empty one is skipped at both ends.
        ops = []
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send, right, group))
        if into.numel():
            ops.append(dist.P2POp(dist.irecv, into, left, group))
        if ops:
            works = issue(lambda: dist.batch_isend_irecv(ops), timeout, "ring_all_reduce", group)
            wait_all(works, timeout, "ring_all_reduce", group)

    for step in range(world - 1):  # reduce-scatter: rank r ends owning chunk r + 1
        send_i, recv_i = (rank - step) % world, (rank - step - 1) % world
        dst = chunks[recv_i]
        exchange(chunks[send_i], recv[: dst.numel()])
        last = step == world - 2
        alpha = 1.0 / world if (last and op == dist.ReduceOp.AVG) else 1.0
        ring_reduce(dst, recv[: dst.numel()], op_code, alpha)
    for step in range(world - 1):  # all-gather of the owned chunks
        send_i, recv_i = (rank - step + 1) % world, (rank - step) % world
        exchange(chunks[send_i], chunks[recv_i])


# ----------------------------------------------------------------------------------------------
# Compressed all-reduce


@dataclass
class CompressedLayout:
    """Sizes of one compressed all-reduce's wire buffers (see kernels.py)."""

    numel: int
    world: int
    block: int
    blocks_per_shard: int
    align: int = 1  # bytes every chunk is padded to

    @property
    def shard(self) -> int:
        return self.blocks_per_shard * self.block

    @property
    def payload_bytes(self) -> int:
        """A chunk's codes and scales."""
        return self.shard + 4 * self.blocks_per_shard

    @property
    def chunk_bytes(self) -> int:
        # The symmetric-memory path pads chunks to 16 bytes: every chunk starts aligned, so
        # the kernels reading chunks at peer addresses move 16 bytes a load, not one.
        return cdiv(self.payload_bytes, self.align) * self.align

    @property
    def padded(self) -> int:
        return self.world * self.shard

    def wire_bytes(self) -> int:
        """Bytes this rank sends (or reads from its peers): world - 1 chunks' payloads in the
        all-to-all and in the all-gather (the a2a path has no padding)."""
        return 2 * (self.world - 1) * self.payload_bytes

    @classmethod
    def of(cls, numel: int, world: int, cfg: CompressConfig, align: int = 1) -> CompressedLayout:
        return cls(numel, world, cfg.block, max(1, cdiv(cdiv(numel, world), cfg.block)), align)


def _views(buf: torch.Tensor, lay: CompressedLayout, code_dtype: torch.dtype):
    """Codes and scales of a (rows, chunk_bytes) uint8 wire buffer."""
    codes = buf[..., : lay.shard].view(code_dtype)
    scales = buf[..., lay.shard : lay.shard + 4 * lay.blocks_per_shard].view(torch.float32)
    return codes, scales


def quantize_chunks(
    flat: torch.Tensor,
    worker_res: torch.Tensor | None,
    wire: torch.Tensor,
    lay: CompressedLayout,
    cfg: CompressConfig,
) -> None:
    """Quantize ``flat`` (plus ``worker_res``, updated: the error feedback) into ``wire``, a
    (world, chunk_bytes) uint8 buffer of chunks (codes, then scales)."""
    fmt = get_format(cfg.dtype)
    sq, ss = _views(wire, lay, cfg.dtype)
    n_blocks = lay.world * lay.blocks_per_shard
    bpp = cfg.blocks_per_program
    K._ef_quantize_kernel[(cdiv(n_blocks, bpp),)](
        flat, worker_res, sq, ss, flat.numel(), n_blocks, lay.blocks_per_shard,
        sq.stride(0), ss.stride(0), QMAX=fmt.qmax, IS_FLOAT=fmt.is_float, MANT=fmt.mantissa,
        EMIN=fmt.emin, B=lay.block, BLOCK_G=bpp, HAS_RES=worker_res is not None,
        EMULATE=interpreter_enabled(), num_warps=cfg.num_warps,
    )  # fmt: skip


def compressed_all_reduce_flat(
    flat: torch.Tensor,
    out: torch.Tensor,
    group,
    cfg: CompressConfig,
    worker_res: torch.Tensor | None,
    server_res: torch.Tensor | None,
    average: bool,
    timeout: datetime.timedelta | None,
) -> int:
    """Reduce ``flat`` over the group into ``out`` (both 1-D, contiguous, same numel) through
    ``cfg.dtype`` codes; returns the bytes this rank sent. ``worker_res`` (``padded`` float32)
    and ``server_res`` (``shard`` float32) carry the error feedback when given."""
    world = dist.get_world_size(group)
    lay = CompressedLayout.of(flat.numel(), world, cfg)
    fmt = get_format(cfg.dtype)
    emulate = interpreter_enabled()
    qmeta = {"QMAX": fmt.qmax, "IS_FLOAT": fmt.is_float, "MANT": fmt.mantissa, "EMIN": fmt.emin}
    dev = flat.device
    send = torch.empty((world, lay.chunk_bytes), dtype=torch.uint8, device=dev)
    quantize_chunks(flat, worker_res, send, lay, cfg)
    recv = torch.empty_like(send)
    what = "compressed_all_reduce"
    work = issue(
        lambda: dist.all_to_all_single(recv, send, group=group, async_op=True), timeout, what, group
    )
    wait_all([work], timeout, what, group)
    mine = torch.empty(lay.chunk_bytes, dtype=torch.uint8, device=dev)
    rq, rs = _views(recv, lay, cfg.dtype)
    mq, ms = _views(mine, lay, cfg.dtype)
    reduce_bpp, reduce_warps = cfg.reduce_launch
    K._dequant_acc_requant_kernel[(cdiv(lay.blocks_per_shard, reduce_bpp),)](
        rq, rs, mq, ms, server_res, lay.blocks_per_shard, rq.stride(0), rs.stride(0),
        1.0 / world if average else 1.0, WORLD=world, **qmeta, B=lay.block, BLOCK_G=reduce_bpp,
        HAS_RES=server_res is not None, EMULATE=emulate, num_warps=reduce_warps,
    )  # fmt: skip
    gathered = torch.empty_like(send)
    # A flat output: gloo's all_gather_into_tensor takes no (world, n) one.
    work = issue(
        lambda: dist.all_gather_into_tensor(gathered.view(-1), mine, group=group, async_op=True),
        timeout, what, group,
    )  # fmt: skip
    wait_all([work], timeout, what, group)
    gq, gs = _views(gathered, lay, cfg.dtype)
    exact = out.numel() == lay.padded
    out2 = (
        out.view(world, lay.shard)
        if exact
        else torch.empty((world, lay.shard), dtype=out.dtype, device=dev)
    )
    dequantize_2d(gq, gs, None, out2, 1, lay.block, False, stride_sr=gs.stride(0))
    if not exact:
        out.copy_(out2.view(-1)[: out.numel()])
    return lay.wire_bytes()


def symm_compress_layout(lay: CompressedLayout) -> tuple[int, int]:
    """(bytes of a rank's symmetric buffer half, offset of its reduced slots) for the compressed
    all-reduce on symmetric memory: ``world`` incoming slots (one per rank's chunk of this
    rank's shard), then ``world`` reduced slots (one per rank's reduced shard)."""
    return 2 * lay.world * lay.chunk_bytes, lay.world * lay.chunk_bytes


def _next_epoch(epoch: int) -> int:
    """The int32 epoch after ``epoch`` (wrapping as the pads' int32 slots do)."""
    return -(1 << 31) if epoch == (1 << 31) - 1 else epoch + 1


class CompressedSymm:
    """The compressed all-reduce on symmetric memory (int8 codes) of one (workspace, numel,
    config, residuals' presence, op), resolved once: one kernel, ``_symm_compressed_kernel``,
    no collective call, every transfer a store into a peer's buffer. Each rank quantizes
    (error feedback) and pushes chunk c into rank c's buffer; after a barrier it dequantizes the
    chunks received, sums, requantizes (error feedback) and pushes the reduced shard into every
    rank's buffer; after a second barrier it dequantizes the reduced shards into the output. The
    barriers are per program, so its programs overlap the phases.

    Bytes over NVLink per rank (writes; the same count as the NCCL path's sends): ``2 (world -
    1) chunk_bytes`` with ``chunk_bytes = shard (1 + 4 / block)``, ``shard = ceil(numel /
    world)`` rounded up to whole blocks; NCCL's ring all-reduce of the uncompressed tensor
    sends ``2 (world - 1) / world * numel * element_size``."""

    __slots__ = ("launch", "sent", "ws")

    def __init__(
        self, ws: SymmWorkspace, numel: int, cfg: CompressConfig, has_res: bool, average: bool
    ) -> None:
        self.ws = ws
        world = ws.world
        lay = CompressedLayout.of(numel, world, cfg, align=16)
        tiles = cdiv(lay.blocks_per_shard, cfg.blocks_per_program)
        programs = max(1, min(tiles, ws.max_programs, ws.resident_programs))
        args = {"x_ptr": None, "out_ptr": None, "res_ptr": None, "buf_table": ws.buf_table,
                "pad_table": ws.pad_table, "n": numel,
                "blocks_per_shard": lay.blocks_per_shard, "chunk_bytes": lay.chunk_bytes,
                "alpha": 1.0 / world if average else 1.0, "epoch": 0, "buf_off": 0}  # fmt: skip
        meta = {"RANK": ws.rank, "WORLD": world, "WP2": next_power_of_2(world),
                "QMAX": get_format(torch.int8).qmax, "B": lay.block,
                "BLOCK_G": cfg.blocks_per_program, "HAS_RES": has_res,
                "EMULATE": interpreter_enabled(), "BARRIER": True,
                "num_warps": cfg.num_warps}  # fmt: skip
        names = ("x_ptr", "out_ptr") + (("res_ptr",) if has_res else ())
        self.launch = CachedLaunch(
            K._symm_compressed_kernel, (programs,), args, names, meta, ws, barriers=2
        )
        self.sent = lay.wire_bytes()

    def __call__(self, x: torch.Tensor, out: torch.Tensor, residual: torch.Tensor | None) -> int:
        """Reduce ``x`` (contiguous) into ``out`` (may be ``x``) with the error-feedback state
        ``residual`` (``residual_size`` elements, or None); returns the bytes pushed."""
        self.launch((x, out) if residual is None else (x, out, residual))
        return self.sent


# ----------------------------------------------------------------------------------------------
# Symmetric memory


def symm_unavailable(tensor: torch.Tensor, group) -> str | None:
    """Why the symmetric-memory path cannot run here, or None."""
    if tensor.device.type != "cuda":
        return "symmetric memory needs CUDA tensors"
    if os.environ.get("TRITONKIT_DIST_SYMM", "1") == "0":
        return "TRITONKIT_DIST_SYMM=0"
    try:
        import torch.distributed._symmetric_memory as _symm_mem  # noqa: F401
    except ImportError as exc:  # pragma: no cover - builds without distributed
        return f"torch.distributed._symmetric_memory does not import ({exc})"
    if dist.get_backend(group) != "nccl":
        return f"the process group's backend is {dist.get_backend(group)}, not nccl"
    if torch.cuda.is_current_stream_capturing():
        # A replayed graph would repeat the barrier epochs and buffer halves fixed at capture.
        return "a CUDA graph is being captured (the kernels' barrier epochs change every call)"
    return None


class SymmWorkspace:
    """One symmetric buffer per (group, device, dtype), of two halves of ``numel`` elements
    (calls alternate between them), with the barrier epochs counted here; grown (collectively:
    every rank calls with the same sizes) when a message needs more."""

    def __init__(self, group, device: torch.device, dtype: torch.dtype, numel: int) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        name = (group or dist.group.WORLD).group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before torch 2.8; a deprecated no-op since
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                enable(name)
        self.numel = numel
        self.buffer = symm_mem.empty(2 * numel, dtype=dtype, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, name)  # a group name: every version
        self.rank = self.handle.rank
        self.world = self.handle.world_size
        # Device addresses of the tables, read once (the handle's properties are C++ calls).
        self.buf_table = self.handle.buffer_ptrs_dev
        self.pad_table = self.handle.signal_pad_ptrs_dev
        # Signal-pad slots (int32) each program uses one of per peer.
        # (get_signal_pad_size is newer than symmetric memory; its pads held 2 KB before.)
        pad_bytes = getattr(symm_mem, "get_signal_pad_size", lambda: 2048)()
        self.max_programs = max(1, pad_bytes // 4 // self.world)
        # Programs that fit on the GPU at once (4 programs of 4 warps an SM, whatever their
        # registers): a kernel whose programs wait on the peers' at barriers between phases
        # needs all of them resident.
        self.resident_programs = 4 * sm_count(device)
        # The barrier epochs and buffer halves, advanced by every call of its kernels (the C
        # launches' counter where that module is built: both paths move the same state).
        self.counter = native_launch.counter(numel)
        self.side_stream: torch.cuda.Stream | None = None  # all_gather_matmul's copies

    @property
    def epoch(self) -> int:
        """Barriers passed (modulo 2^32): the pads start at 0."""
        return self.counter.epoch

    @property
    def calls(self) -> int:
        return self.counter.calls

    def advance(self, barriers: int) -> tuple[int, int]:
        """(the first barrier's epoch as an int32, the element offset of the buffers' half)
        for the next call, which passes ``barriers`` barriers."""
        return self.counter.advance(barriers)


_WORKSPACES: dict[tuple, SymmWorkspace] = {}
_RETIRED: list[SymmWorkspace] = []


def workspace(group, device: torch.device, dtype: torch.dtype, numel: int) -> SymmWorkspace:
    g = group or dist.group.WORLD
    key = (g.group_name, device.index, dtype)
    ws = _WORKSPACES.get(key)
    if ws is None or ws.numel < numel:
        if ws is not None:  # kernels queued on the stream may still read it: never freed
            _RETIRED.append(ws)
        # Powers of two (at least 1M elements a half): a few growths cover every size.
        ws = SymmWorkspace(g, device, dtype, max(1 << 20, next_power_of_2(numel)))
        _WORKSPACES[key] = ws
    return ws


class CachedLaunch:
    """One kernel launch of the symmetric-memory paths, resolved once: the grid, scalars and
    constexprs fixed; per call the tensors and the workspace counter's epoch and buffer offset
    (``ws.advance(barriers)``; the kernels take the offset in 16s as ``buf_off``).

    Once Triton's launch of the first call has given the compiled kernel, later calls run from C
    (``native_launch``): its data pointers and the counter's values written into a parameter
    block made once, and cuLaunchKernel. Where that does not apply (the module is not built, a
    tensor of another alignment, another device, a CUDA graph being captured, launch hooks, a
    recording) a call takes the compiled kernel's C launcher (``launch._direct``) or, the first
    time and under the interpreter, ``Kernel.launch`` (always right)."""

    __slots__ = ("_aligned", "_device", "_entry", "_slots", "_values", "args", "barriers")
    __slots__ += ("grid", "kern", "meta", "native", "tensor_names", "ws")

    def __init__(
        self, kern, grid: tuple, args: dict, tensor_names: tuple, meta: dict, ws, barriers: int
    ) -> None:
        self.kern, self.grid, self.args, self.meta = kern, grid, args, meta
        self.tensor_names, self.ws, self.barriers = tensor_names, ws, barriers
        names = list(kern.fn.arg_names) if hasattr(kern.fn, "arg_names") else list(args)
        self._slots = tuple(names.index(k) for k in (*tensor_names, "epoch", "buf_off"))
        self._entry = None
        self._values: list | None = None
        self._device = -1
        self._aligned: tuple = ()
        self.native = None  # not made yet; False: it cannot be

    def fast(self, tensors: tuple) -> bool:
        """Launch from C if that applies (see the class); False, having done nothing, if not."""
        nat = self.native
        return bool(
            nat
            and _L.WARMUP.session is None
            and not _L.PIPE.pending
            and _L.RECORDER.rec is None
            and not self.kern._hooked()
            and nat.run(tensors)
        )

    def __call__(self, tensors: tuple) -> None:
        """Launch with ``tensors`` (as ``tensor_names``), the counter advanced."""
        if self.fast(tensors):
            return
        epoch, off = self.ws.advance(self.barriers)
        scalars = (epoch, off // 16)
        entry = self._entry
        if entry is not None and _L.WARMUP.session is None and not _L.PIPE.pending:
            aligned = tuple([t.data_ptr() & 15 == 0 for t in tensors])
            device = cuda_device()  # torch.cuda.current_device() without its Python around it
            if aligned == self._aligned and device == self._device and not self.kern._hooked():
                values = self._values.copy()
                for i, v in zip(self._slots, (*tensors, *scalars)):
                    values[i] = v
                _L._direct(entry, self.grid, device, values)
                if self.native is None:
                    self._make_native(entry, values, tensors, device)
                return
        args = dict(self.args)
        args.update(zip(self.tensor_names, tensors))
        args.update(zip(("epoch", "buf_off"), scalars))
        entry, values = self.kern._launch(self.grid, tuple(args.values()), self.meta)
        if entry is not None and self._entry is None:
            self._device = torch.cuda.current_device()
            self._make_native(entry, values, tensors, self._device)
            for i in self._slots[: len(tensors)]:
                values[i] = None  # no tensor outlives the call
            self._entry, self._values = entry, values
            self._aligned = tuple(t.data_ptr() % 16 == 0 for t in tensors)

    def _make_native(self, entry, values: list, tensors: tuple, device: int) -> None:
        """The C launch of the kernel just launched with ``values`` (not inside a recording:
        its launches must be seen)."""
        if _L.RECORDER.rec is None:
            n = len(tensors)
            made = native_launch.make(
                entry, self.grid, values, self._slots[:n], tensors, self._slots[n:],
                self.ws.counter, self.barriers, device,
            )  # fmt: skip
            self.native = made if made is not None else False


class SymmAllReduce:
    """The symmetric-memory all-reduce of one (group, numel, dtype, device, op), everything
    but the tensor resolved once: the workspace, the config, the grid and the launch."""

    __slots__ = ("launch", "ws")

    def __init__(self, ws: SymmWorkspace, n: int, cfg: SymmConfig, alpha: float) -> None:
        self.ws = ws
        span = cfg.block if cfg.one_shot else cfg.block * ws.world
        programs = max(1, min(cdiv(n, span), cfg.max_programs, ws.max_programs))
        kern = K._one_shot_kernel if cfg.one_shot else K._two_shot_kernel
        args = {"x_ptr": None, "out_ptr": None, "buf_table": ws.buf_table,
                "pad_table": ws.pad_table, "n": n, "alpha": alpha,
                "epoch": 0, "buf_off": 0}  # fmt: skip
        meta = {"RANK": ws.rank, "WORLD": ws.world, "WP2": next_power_of_2(ws.world),
                "BLOCK": cfg.block, "BARRIER": True, "num_warps": cfg.num_warps}  # fmt: skip
        barriers = 1 if cfg.one_shot else 2
        names = ("x_ptr", "out_ptr")
        self.launch = CachedLaunch(kern, (programs,), args, names, meta, ws, barriers)

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self.launch((x, out))


def symm_launch(
    x: torch.Tensor, out: torch.Tensor, ws: SymmWorkspace, cfg: SymmConfig, alpha: float
) -> None:
    """One-shot or two-shot (``cfg``) all-reduce of ``x`` (flat, contiguous) into ``out``: the
    benchmarks' forced variants (the public function caches its own ``SymmAllReduce``)."""
    key, env = ("collectives.forced", id(ws), x.numel(), x.dtype, cfg, alpha), current_env()
    run = PLANS.peek(key, env)
    if run is None or run.ws is not ws:
        run = SymmAllReduce(ws, x.numel(), cfg, alpha)
        PLANS.put(key, env, run)
    run(x, out)


def fused_norm_launch(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    ws: SymmWorkspace,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused all-reduce + residual add + RMSNorm of ``x`` (contiguous), its launch cached
    per (workspace, shape, dtype, weight or not, eps)."""
    out = torch.empty_like(x)
    res_out = torch.empty_like(residual)
    key = ("collectives.fused", id(ws), tuple(x.shape), x.dtype, weight is None, eps)
    env = current_env()
    launch = PLANS.peek(key, env)
    if launch is None:
        rows = math.prod(x.shape[:-1])
        hidden = x.shape[-1]
        cfg = FusedNormConfig.heuristic(hidden)
        programs = max(1, min(rows, cfg.max_programs, ws.max_programs))
        names = ("x_ptr", "res_ptr", "out_ptr", "res_out_ptr")
        names += () if weight is None else ("w_ptr",)
        args = {"x_ptr": None, "res_ptr": None, "w_ptr": None, "out_ptr": None,
                "res_out_ptr": None, "buf_table": ws.buf_table, "pad_table": ws.pad_table,
                "n_rows": rows, "H": hidden, "eps": eps, "epoch": 0, "buf_off": 0}  # fmt: skip
        meta = {"RANK": ws.rank, "WORLD": ws.world, "WP2": next_power_of_2(ws.world),
                "BLOCK_H": next_power_of_2(hidden), "HAS_WEIGHT": weight is not None,
                "BARRIER": True, "num_warps": cfg.num_warps}  # fmt: skip
        kern = K._all_reduce_add_rms_norm_kernel
        launch = CachedLaunch(kern, (programs,), args, names, meta, ws, barriers=1)
        PLANS.put(key, env, launch)
    tensors = (x, residual, out, res_out) + (() if weight is None else (weight,))
    launch(tensors)
    return out, res_out


def all_gather_matmul_symm(a: torch.Tensor, b: torch.Tensor, ws: SymmWorkspace) -> torch.Tensor:
    """``cat(all_gather(a)) @ b`` through symmetric memory: on a side stream the copy engines
    store ``a`` (contiguous, (m, k)) into every peer's buffer and a one-program barrier meets the
    peers; meanwhile this rank's own rows are multiplied on the current stream; then the peers'
    rows, read from this rank's buffer. Calls alternate between the buffer's halves: a peer
    stores into a half again two calls on, after the barrier of the call between, which this
    rank's side stream reaches only after the products of this call (it waits for the current
    stream first)."""
    world, rank = ws.world, ws.rank
    m, k = a.shape
    epoch, half = ws.advance(1)
    main = torch.cuda.current_stream(a.device)
    if ws.side_stream is None:  # the copies' stream: one per workspace (its device)
        ws.side_stream = torch.cuda.Stream(a.device)
    side = ws.side_stream
    side.wait_stream(main)
    with torch.cuda.stream(side):
        for j in range(1, world):
            peer = (rank + j) % world
            slot = ws.handle.get_buffer(peer, (m, k), a.dtype, storage_offset=half + rank * m * k)
            slot.copy_(a)
        K._barrier_kernel[(1,)](ws.pad_table, epoch, RANK=rank, WORLD=world,
                                WP2=next_power_of_2(world))  # fmt: skip
    a.record_stream(side)  # the allocator must not reuse a's memory before the copies ran
    out = torch.empty((world * m, b.shape[1]), dtype=a.dtype, device=a.device)
    matmul_into(a, b, out[rank * m : (rank + 1) * m])
    main.wait_stream(side)
    gathered = ws.buffer[half : half + world * m * k].view(world * m, k)
    if rank > 0:
        matmul_into(gathered[: rank * m], b, out[: rank * m])
    if rank < world - 1:
        matmul_into(gathered[(rank + 1) * m :], b, out[(rank + 1) * m :])
    return out


def add_rms_norm_reference(
    reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = reduced + residual`` in float32, normalized, and h rounded (the fused kernel's
    formula in torch, for the fallback and the tests).

    Args:
        reduced: the all-reduced partial sums.
        residual: the residual stream.
        weight: (hidden,) scale, or None.
        eps: added to the mean square.
    """
    if reduced.is_cuda:
        from tritonkit.ops.norm import add_rms_norm

        return add_rms_norm(reduced, residual, weight, eps)
    h = reduced.float() + residual.float()
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(reduced.dtype), h.to(reduced.dtype)
