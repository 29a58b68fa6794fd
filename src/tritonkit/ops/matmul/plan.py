"""The matmul family's host path: a GEMM problem's config (tuned once per problem class), its
bound launches, and the plan that repeats them (the launchers that build problems from their
inputs are in ``launchers.py`` and ``lowp.py``).

Every decision a call makes depends only on its inputs' shapes, strides, dtypes, 16-byte
alignment and device, the epilogue's, the config and the options: which path and tile, the
copies, TMA or pointer loads, 64-bit offsets, the grid, the constexprs. ``GemmPlan`` holds them
all, cached per those in the one plan cache (``plan.cached``: a change of tuning settings
plans anew), with each kernel bound once (``launch.Bound``): a repeated call allocates its
outputs, makes the copies the plan says and launches, instead of rebuilding the config's
tuning key, encoding TMA descriptors and binding every argument again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tritonkit import _tuning
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.gemm import (
    FP8_DTYPES,
    Epilogue,
    Problem,
    extent,
    layout_flags,
    matrix,
    scale_mode,
    size_class,
    tf32_enabled,
    tma_orientation,
)
from tritonkit.ops._core.launch import TensorDescriptor
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, next_power_of_2
from tritonkit.ops._core.math import ACTIVATIONS
from tritonkit.ops._core.plan import cached
from tritonkit.ops.matmul.configs import (
    FIXED,
    GEMM_OPTIONS,
    GemmOptions,
    MatmulConfig,
    candidates,
    fixed_config,
    operand_class,
    promotion,
)
from tritonkit.ops.matmul.decode import (
    INT8,
    MAX_M,
    DecodeGemmConfig,
    decode_gemm_kernel,
    decode_ok,
    input_precision,
    operands_mode,
)
from tritonkit.ops.matmul.ieee import fma_copies_b
from tritonkit.ops.matmul.persistent import matmul_persistent_kernel
from tritonkit.ops.matmul.splitk import (
    REDUCE_BLOCK,
    REDUCE_WARPS,
    split_k_for,
    splitk_reduce_kernel,
)
from tritonkit.ops.matmul.tiled import matmul_tile_kernel
from tritonkit.ops.memory import transpose_fwd

Prep = Callable[[torch.Tensor], torch.Tensor]


def as_is(t: torch.Tensor) -> torch.Tensor:
    return t


# ----------------------------------------------------------------------------------------------
# TMA
# ----------------------------------------------------------------------------------------------


def tma_device(device: torch.device, options: GemmOptions = GEMM_OPTIONS) -> bool:
    if interpreter_enabled():
        return options.interpreter_tma
    if TensorDescriptor is None or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def tma_ok(p: Problem, options: GemmOptions = GEMM_OPTIONS) -> bool:
    """Whether every operand of ``p`` can go through TMA descriptors."""
    if p.n_batch != 1 or min(p.m, p.n, p.k) < 16 or not tma_device(p.c.tensor.device, options):
        return False
    a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
    a_t, b_t = layout_flags(p)
    if a.element_size() != 2 and (a_t or not b_t):
        # wgmma reads 8-bit and tf32 operands K-major only; other layouts take the pointer path.
        return False
    return tma_orientation(a, not a_t) and tma_orientation(b, not b_t) and tma_orientation(c, True)


def _descriptor_specs(p: Problem, cfg: MatmulConfig) -> tuple[tuple, tuple, tuple]:
    """(shape, strides, block) of the host descriptors of A (or A^T), B (or B^T) and C."""
    a_t, b_t = layout_flags(p)
    _, _, s_am, s_ak = p.a.strides
    _, _, s_bk, s_bn = p.b.strides
    bm, bn, bk = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    a = ([p.k, p.m], [s_ak, 1], [bk, bm]) if a_t else ([p.m, p.k], [s_am, 1], [bm, bk])
    b = ([p.n, p.k], [s_bn, 1], [bn, bk]) if b_t else ([p.k, p.n], [s_bk, 1], [bk, bn])
    c = ([p.m, p.n], [p.c.strides[2], 1], [bm, bn // 2 if cfg.subtile else bn])
    return a, b, c


# ----------------------------------------------------------------------------------------------
# One GEMM launch, bound
# ----------------------------------------------------------------------------------------------


class GemmLaunch:
    """The kernel launches of one problem signature with one config: the main kernel and, with
    SPLIT_K > 1, the reduction, each bound once; the tensors come at each call."""

    __slots__ = ("config", "host_descs", "int64", "layout", "main", "reduce", "use_tma", "ws")

    def __init__(self, p: Problem, epi: Epilogue, cfg: MatmulConfig, options: GemmOptions):
        a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
        device = c.device
        acc_int = a.dtype == torch.int8
        self.config = cfg
        self.use_tma = use_tma = cfg.tma and tma_ok(p, options)
        self.layout = a_t, b_t = layout_flags(p)
        split = cfg.SPLIT_K if p.n_batch == 1 else 1
        k_split = max(1, cdiv(cdiv(p.k, cfg.BLOCK_K), split)) * cfg.BLOCK_K
        plane = p.m * p.n
        self.ws = None
        if split > 1:
            self.ws = ((split, p.m, p.n), torch.int32 if acc_int else torch.float32, device)
        ws = torch.empty(self.ws[0], dtype=self.ws[1], device=device) if split > 1 else None
        device_desc = use_tma and options.descriptors == "device"
        self.host_descs = _descriptor_specs(p, cfg) if use_tma and not device_desc else None
        descs = self._descriptors(a, b, c)
        views = [a, b, c] + [t for t in (epi.residual, epi.z, ws) if t is not None]
        self.int64 = any(extent(t) >= options.int64_above for t in views)
        precision = None
        if a.dtype == torch.float32:
            precision = "tf32" if tf32_enabled() else "ieee"
        max_imprecise, promote_blocks = promotion(cfg) if a.dtype in FP8_DTYPES else (None, 1)
        n_sms = options.sms or sm_count(device)
        total = p.n_batch * cdiv(p.m, cfg.BLOCK_M) * cdiv(p.n, cfg.BLOCK_N) * split
        common = dict(
            FLOAT_OUT=c.dtype.is_floating_point,
            SCALE_A=scale_mode(epi.scale_a, epi.scale_a_rows),
            SCALE_B=scale_mode(epi.scale_b, epi.scale_b_cols),
            HAS_BIAS=epi.bias is not None,
            ACT=ACTIVATIONS[epi.activation],
            HAS_RES=epi.res_code(),
            STORE_Z=epi.z is not None,
        )
        meta = dict(
            USE_TMA=use_tma,
            DEVICE_DESC=device_desc,
            A_T=a_t,
            B_T=b_t,
            EPILOGUE_SUBTILE=cfg.subtile and use_tma,
            SPLIT_K=split,
            DOT=cfg.dot,
            INPUT_PRECISION=precision,
            # fp8 on Hopper: promote the tensor cores' partial sums to fp32 (configs.promotion).
            MAX_IMPRECISE=max_imprecise,
            PROMOTE_BLOCKS=promote_blocks,
            # bf16 tl.dot is wrong under the CPU interpreter, fp32 exact: upcast there only.
            UPCAST=interpreter_enabled() and a.dtype == torch.bfloat16 and cfg.dot,
            ACC_INT=acc_int,
            EVEN_K=p.k % cfg.BLOCK_K == 0,
            INT64=self.int64,
            BLOCK_M=cfg.BLOCK_M,
            BLOCK_N=cfg.BLOCK_N,
            BLOCK_K=cfg.BLOCK_K,
            GROUP_M=cfg.GROUP_M,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            **common,
        )
        if cfg.persistent:
            grid = (min(n_sms, total),)
            main = matmul_persistent_kernel
            meta.update(
                NUM_SMS=n_sms,
                # Flattening the tile and K loops (one software pipeline across tiles) gains
                # with one accumulator; with the hand promotion's branch it lost (see
                # docs/performance.md).
                FLATTEN=not cfg.warp_specialize and promote_blocks == 1,
                WARP_SPECIALIZE=cfg.warp_specialize,
            )
        else:
            grid, main = (total,), matmul_tile_kernel
        tensors = (a, b, c, ws, *descs, *epi.tensors())
        epi_strides = epi.strides()
        self.main = main.bind(
            grid, *tensors, p.m, p.n, p.k, k_split, plane, p.n_batch, p.batch[1],
            *p.a.strides, *p.b.strides, *p.c.strides, *epi_strides, **meta,
        )  # fmt: skip
        self.reduce = None
        if split > 1:
            block_m, block_n = REDUCE_BLOCK
            self.reduce = splitk_reduce_kernel.bind(
                (cdiv(p.m, block_m) * cdiv(p.n, block_n),), ws, c, *epi.tensors(), p.m, p.n,
                plane, *p.c.strides[2:], *epi_strides, SPLIT_K=split, INT64=self.int64,
                BLOCK_M=block_m, BLOCK_N=block_n, num_warps=REDUCE_WARPS,
                **common,
            )  # fmt: skip

    def _descriptors(self, a, b, c) -> tuple:
        specs = self.host_descs
        if specs is None:
            return None, None, None
        return tuple(TensorDescriptor(t, *spec) for t, spec in zip((a, b, c), specs))

    def __call__(self, a, b, c, epi_tensors: Sequence[torch.Tensor | None]) -> None:
        """Launch on the kernel operands ``a``, ``b``, the output ``c`` and the epilogue's
        tensors (``Epilogue.tensors()`` order; None where the plan has none)."""
        ws = None
        if self.ws is not None:
            shape, dtype, device = self.ws
            ws = torch.empty(shape, dtype=dtype, device=device)
        args = [t for t in (a, b, c, ws) if t is not None]
        if self.host_descs is not None:
            args += self._descriptors(a, b, c)
        present = [t for t in epi_tensors if t is not None]
        self.main(*args, *present)
        if self.reduce is not None:
            self.reduce(ws, c, *present)


# ----------------------------------------------------------------------------------------------
# Configs: tuned per problem class
# ----------------------------------------------------------------------------------------------


def tuned(
    p: Problem, epi: Epilogue, kind: str, split: int = 1, options: GemmOptions = GEMM_OPTIONS
) -> MatmulConfig:
    """The best config of ``kind`` for this problem class, from the autotune cache or timed now."""
    a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
    cls = operand_class(a.dtype)
    tma = kind == "persistent" and tma_ok(p, options)
    a_t, b_t = layout_flags(p)
    space = options.space
    key = {
        "kind": kind,
        "m": size_class(p.m, space.key_step, space.fine_key_limit),
        "n": size_class(p.n, space.key_step, space.fine_key_limit),
        "k": next_power_of_2(p.k),
        "batched": p.n_batch > 1,
        "a": _dtype_key(a.dtype),
        "b": _dtype_key(b.dtype),
        "out": _dtype_key(c.dtype),
        "layout": ("T" if a_t else "N") + ("T" if b_t else "N"),
        "class": cls,
        "tma": tma,
        "split": split,
    }
    sizes = (a.element_size(), b.element_size(), c.element_size())

    def prune(cfg: _tuning.Config) -> bool:
        return _tuning.fits_shared_memory(MatmulConfig.from_tuning(cfg).smem_bytes(*sizes))

    launches: dict[MatmulConfig, GemmLaunch] = {}

    def run(cfg: _tuning.Config) -> None:
        # One bound launch per candidate: the timed calls then cost what a planned call costs
        # on the host, not the planning (which small problems would be timed by instead).
        config = MatmulConfig.from_tuning(cfg)
        launch = launches.get(config)
        if launch is None:
            launch = launches[config] = GemmLaunch(p, epi, config, options)
        launch(p.a.tensor, p.b.tensor, p.c.tensor, epi.tensors())

    def choose() -> MatmulConfig:
        # Pruned here as well as in the search: with tuning off, tune() runs candidates[0] as
        # is, and the default must fit this GPU's shared memory (an A100 has 163 KB, Hopper 227).
        cands = [cand.tuning() for cand in candidates(kind, cls, tma, p.m, split, options)]
        cands = [cand for cand in cands if prune(cand)] or cands
        return MatmulConfig.from_tuning(_tuning.tune("matmul", key, cands, run, prune=prune))

    # The exact M as well as its class: the split-K candidates depend on it; and the options'
    # tile space and split-K rule, which the candidates come from.
    memo = (tuple(key.items()), p.m, sizes, options.space)
    return cached("matmul", memo, choose)


def _dtype_key(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_config(
    p: Problem, epi: Epilogue, path: str, config: MatmulConfig | None, options: GemmOptions
) -> MatmulConfig:
    """``config``, or the config of ``path``: a variant name, or "best" (persistent, split-K
    when skinny)."""
    if config is not None:
        return config
    if path in FIXED:
        return fixed_config(path, p.a.tensor.element_size())
    if path in ("autotuned", "persistent"):
        return tuned(p, epi, path, options=options)
    sms = options.sms or sm_count(p.c.tensor.device)
    split = split_k_for(p.m, p.n, p.k, p.n_batch, sms)
    if split > 1:
        return tuned(p, epi, "splitk", split, options)
    return tuned(p, epi, "persistent", options=options)


def signature(t: torch.Tensor | None) -> tuple | None:
    """What a plan depends on of a tensor: shape, strides, dtype, 16-byte alignment."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0


def fp32_mode(dtype: torch.dtype) -> bool | None:
    """For a float32 GEMM, whether TF32 is on (plans differ); None for other dtypes."""
    return tf32_enabled() if dtype == torch.float32 else None


# ----------------------------------------------------------------------------------------------
# GEMM plans
# ----------------------------------------------------------------------------------------------


class GemmPlan:
    """One launcher's plan for one input signature: how its inputs become the kernel's operands
    (``prep_a``, ``prep_b``: as they are, or copied), the copies counted, and the launch.

    ``copies`` says which operands are copied per call ("batch": the batch dimensions made
    contiguous; "rows": a K-major fp32 B row-major; "kmajor": an 8-bit operand K-major).
    """

    __slots__ = ("copies", "launch", "n_copies", "prep_a", "prep_b")

    def __init__(
        self, launch: GemmLaunch | DecodeGemmLaunch, prep_a: Prep, prep_b: Prep, copies: tuple
    ) -> None:
        self.launch, self.prep_a, self.prep_b, self.copies = launch, prep_a, prep_b, copies
        self.n_copies = sum(2 if c == "batch" else 1 for c in copies if c)

    @property
    def config(self) -> MatmulConfig:
        return self.launch.config

    @property
    def use_tma(self) -> bool:
        return self.launch.use_tma

    @property
    def layout(self) -> tuple[bool, bool]:
        return self.launch.layout

    @property
    def int64(self) -> bool:
        return self.launch.int64

    def operands(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.n_copies:
            LAYOUT_COPIES.count += self.n_copies
        return self.prep_a(a), self.prep_b(b)


def _fma_copy(b2d: Prep) -> Prep:
    # b2d(b) is a (K, N) view with unit K stride: its .t() is an (N, K) row-major view (a
    # slice's row stride may exceed K), which the tiled transpose copies into (K, N) row-major.
    return lambda b: transpose_fwd(b2d(b).t())


def build_plan(
    p: Problem,
    epi: Epilogue,
    path: str,
    config: MatmulConfig | None,
    options: GemmOptions,
    prep_a: Prep = as_is,
    prep_b: Prep = as_is,
    copies: tuple = (None, None),
    b2d: Prep = as_is,
) -> GemmPlan:
    """The plan of problem ``p`` (built on the first call's tensors); ``b2d`` maps the
    launcher's b to the problem's 2-D B, for the row-major copy of a K-major fp32 B.

    At most ``options.decode_max_m`` rows (and no forced config or variant): the decode
    kernel, which reads every operand in place."""
    if config is None and path == "best" and decode_ok(p, options.decode_max_m):
        return GemmPlan(decode_launch(p, epi, sms=options.sms), prep_a, prep_b, copies)
    if config is None and path == "best" and fma_copies_b(p, options):
        b_rows = transpose_fwd(p.b.tensor.t())
        p = Problem(p.a, matrix(b_rows), p.c, p.m, p.n, p.k)
        prep_b, copies = _fma_copy(b2d), (copies[0], "rows")
    cfg = resolve_config(p, epi, path, config, options)
    return GemmPlan(GemmLaunch(p, epi, cfg, options), prep_a, prep_b, copies)


def decode_config(p: Problem, epi: Epilogue, sms: int | None = None) -> DecodeGemmConfig:
    """The config of ``p``'s decode launch: tuned per (M's power of 2, N, K, dtypes, B's
    layout, precision) where tuning runs, the heuristic elsewhere; kept in the plan cache."""
    a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
    sms = sms or sm_count(c.device)
    precision = input_precision(a.dtype, b.dtype)
    b_bytes = b.element_size()
    key = {
        "m": next_power_of_2(p.m),
        "n": p.n,
        "k": p.k,
        "a": _dtype_key(a.dtype),
        "b": _dtype_key(b.dtype),
        "out": _dtype_key(c.dtype),
        "b_kmajor": p.b.strides[2] == 1,
        "precision": precision,
    }

    def prune(cfg: _tuning.Config) -> bool:
        cand = DecodeGemmConfig.from_tuning(cfg)
        return _tuning.fits_shared_memory(cand.smem_bytes(a.element_size(), b_bytes))

    launches: dict[DecodeGemmConfig, DecodeGemmLaunch] = {}

    def run(cfg: _tuning.Config) -> None:
        config = DecodeGemmConfig.from_tuning(cfg)
        launch = launches.get(config)
        if launch is None:
            launch = launches[config] = DecodeGemmLaunch(p, epi, config)
        launch(a, b, c, epi.tensors())

    def neighbours(cfg: _tuning.Config) -> list[_tuning.Config]:
        return [n.tuning() for n in DecodeGemmConfig.from_tuning(cfg).neighbours(p.k, b_bytes)]

    def choose() -> DecodeGemmConfig:
        # M's power of 2, as the key holds it: every M of the class gets the same candidates
        m = next_power_of_2(p.m)
        space = DecodeGemmConfig.space(m, p.n, p.k, a.element_size(), b_bytes, sms, key["b_kmajor"])
        cands = [cfg.tuning() for cfg in space]
        cands = [cfg for cfg in cands if prune(cfg)] or cands
        best = _tuning.tune("matmul_decode", key, cands, run, neighbours=neighbours, prune=prune)
        return DecodeGemmConfig.from_tuning(best)

    return cached("matmul.decode_config", (tuple(key.items()), sms), choose)


# ----------------------------------------------------------------------------------------------
# The launch, bound
# ----------------------------------------------------------------------------------------------


class DecodeGemmLaunch:
    """The decode kernel's launches for one problem signature and config (with SPLIT_K > 1,
    the reduction too), each bound once; called as ``GemmLaunch`` is, with the operands, the
    output and the epilogue's tensors."""

    __slots__ = ("config", "int64", "layout", "main", "reduce", "use_tma", "ws")

    def __init__(self, p: Problem, epi: Epilogue, cfg: DecodeGemmConfig) -> None:
        a, b, c = p.a.tensor, p.b.tensor, p.c.tensor
        mode = operands_mode(a.dtype, b.dtype)
        if mode is None or not 0 < p.m <= MAX_M or p.n_batch != 1:
            raise ValueError(
                f"decode_gemm_kernel: A ({p.m} x {p.k}, {a.dtype}) and B ({b.dtype}) are not a "
                f"decode product (at most {MAX_M} rows, one matrix, supported dtypes)"
            )
        self.config = cfg
        self.use_tma, self.int64 = False, True
        self.layout = layout_flags(p)
        split = cfg.SPLIT_K
        k_split = cdiv(cdiv(p.k, cfg.BLOCK_K), split) * cfg.BLOCK_K
        acc_dtype = torch.int32 if mode == INT8.value else torch.float32
        self.ws = ((split, p.m, p.n), acc_dtype, c.device) if split > 1 else None
        ws = torch.empty(self.ws[0], dtype=acc_dtype, device=c.device) if split > 1 else None
        precision = input_precision(a.dtype, b.dtype)
        common = dict(
            FLOAT_OUT=c.dtype.is_floating_point,
            SCALE_A=scale_mode(epi.scale_a, epi.scale_a_rows),
            SCALE_B=scale_mode(epi.scale_b, epi.scale_b_cols),
            HAS_BIAS=epi.bias is not None,
            ACT=ACTIVATIONS[epi.activation],
            HAS_RES=epi.res_code(),
            STORE_Z=epi.z is not None,
        )
        epi_strides = epi.strides()
        target = c if split == 1 else ws
        self.main = decode_gemm_kernel.bind(
            (cdiv(p.n, cfg.BLOCK_N), split), a, b, target, *epi.tensors(), p.m, p.n, p.k,
            k_split, p.a.strides[2], p.a.strides[3], p.b.strides[2], p.b.strides[3],
            p.c.strides[2], p.c.strides[3], *epi_strides,
            OPERANDS=mode, INPUT_PRECISION=precision,
            UPCAST=interpreter_enabled() and mode != INT8.value,
            EVEN_K=p.k % cfg.BLOCK_K == 0, SPLIT_K=split, BLOCK_M=MAX_M,
            BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common,
        )  # fmt: skip
        self.reduce = None
        if split > 1:
            block_m, block_n = MAX_M, 128
            self.reduce = splitk_reduce_kernel.bind(
                (cdiv(p.m, block_m) * cdiv(p.n, block_n),), ws, c, *epi.tensors(), p.m, p.n,
                p.m * p.n, p.c.strides[2], p.c.strides[3], *epi_strides, SPLIT_K=split,
                INT64=p.m * p.n * split >= 2**31, BLOCK_M=block_m, BLOCK_N=block_n,
                num_warps=4, **common,
            )  # fmt: skip

    def __call__(self, a, b, c, epi_tensors) -> None:
        """Launch on A, B, the output C and the epilogue's tensors (``Epilogue.tensors()``
        order; None where the plan has none)."""
        present = [t for t in epi_tensors if t is not None]
        if self.ws is None:
            self.main(a, b, c, *present)
            return
        shape, dtype, device = self.ws
        ws = torch.empty(shape, dtype=dtype, device=device)
        self.main(a, b, ws, *present)
        self.reduce(ws, c, *present)


def decode_launch(
    p: Problem, epi: Epilogue, config: DecodeGemmConfig | None = None, sms: int | None = None
) -> DecodeGemmLaunch:
    """The bound decode launch of ``p`` (``decode_ok``) with ``epi``; its config is
    ``decode_config``'s for ``sms`` SMs (None: the device's) unless given."""
    if config is None:
        config = decode_config(p, epi, sms)
    return DecodeGemmLaunch(p, epi, config)


# ---- the plans a launcher's call runs -----------------------------------------------------------


class MatmulPlan:
    """``matmul_fwd``'s plan: the output's shape and the GEMM (None when there is nothing to
    compute)."""

    __slots__ = ("c_shape", "gemm", "out_shape")

    def __init__(self, c_shape, out_shape, gemm: GemmPlan | None) -> None:
        self.c_shape, self.out_shape, self.gemm = c_shape, out_shape, gemm

    def run(self, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        c = torch.empty(self.c_shape, dtype=out_dtype, device=a.device)
        gemm = self.gemm
        if gemm is not None:
            a, b = gemm.operands(a, b)
            gemm.launch(a, b, c, (None,) * 5)
        return c.view(self.out_shape) if self.out_shape is not None else c


class LinearPlan:
    """``linear_fwd``'s plan: output shapes and the GEMM (None when the output is empty)."""

    __slots__ = ("gemm", "m", "n", "save_z")

    def __init__(self, m: int, n: int, save_z: bool, gemm: GemmPlan | None) -> None:
        self.m, self.n, self.save_z, self.gemm = m, n, save_z, gemm

    def run(self, x, weight, bias, residual) -> tuple[torch.Tensor, torch.Tensor]:
        m, n = self.m, self.n
        y = torch.empty((m, n), dtype=x.dtype, device=x.device)
        z = torch.empty((m, n) if self.save_z else (0,), dtype=x.dtype, device=x.device)
        gemm = self.gemm
        if gemm is not None:
            a, b = gemm.operands(x, weight)
            gemm.launch(a, b, y, (None, None, bias, residual, z if self.save_z else None))
        return y, z
