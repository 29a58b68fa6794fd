"""The conv launchers: output allocation, the path and config choice, the grid, the launch.

Arguments arrive validated (``function.py``): 4-D tensors, ``padding`` as four ints (top,
bottom, left, right; "same" with an even window pads one more at the bottom/right, as torch
does). The choice of path and config depends only on the problem (``ConvProblem``) and the
Env, so it is a plan kept in the one plan cache.
"""

from __future__ import annotations

import math

import torch

from tritonkit import _tuning
from tritonkit.ops._core.device import interpreter_enabled, sm_count
from tritonkit.ops._core.gemm import Epilogue, Problem, matrix
from tritonkit.ops._core.layout import LAYOUT_COPIES, cdiv, next_power_of_2
from tritonkit.ops._core.math import ACTIVATIONS
from tritonkit.ops._core.plan import cached, current_env
from tritonkit.ops.conv.config import (
    ConvProblem,
    DepthwiseConfig,
    GemmConfig,
    WgradConfig,
    fits,
    fwd_splits,
    plane_tile,
)
from tritonkit.ops.conv.kernels import (
    act_grad_kernel,
    bias_grad_kernel,
    conv1x1_kernel,
    conv_dgrad_kernel,
    conv_dgrad_phase_kernel,
    conv_fwd_kernel,
    conv_fwd_rows_kernel,
    conv_wgrad_kernel,
    depthwise_kernel,
    split_sum_kernel,
)
from tritonkit.ops.conv.kernels_tma import (
    conv1x1_tma_kernel,
    conv_fwd_tma_kernel,
    split_epilogue_kernel,
)
from tritonkit.ops.conv.kernels_variants import (
    conv_direct_kernel,
    im2col_kernel,
    winograd_input_kernel,
    winograd_output_kernel,
    winograd_weight_kernel,
)
from tritonkit.ops.matmul.configs import GEMM_OPTIONS
from tritonkit.ops.matmul.launchers import matmul_fwd
from tritonkit.ops.matmul.plan import build_plan, tma_device


def channels_last_strides(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """PyTorch's ``is_channels_last_strides_2d`` (c10/core/MemoryFormat.h): whether a 4-D
    tensor's strides suggest channels_last, ambiguous cases (N111) read as NCHW."""
    if len(size) != 4 or stride[1] == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        if size[d] == 0 or stride[d] < low:
            return False
        if d == 0 and low == stride[1]:
            return False
        low = stride[d] * (size[d] if size[d] > 1 else 1)
    return True


def output_format(x: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The output layout PyTorch's convolution gives: channels_last when the input's or the
    weight's strides suggest it (cuDNN's and oneDNN's rule), else contiguous."""
    if channels_last_strides(tuple(x.shape), x.stride()) or channels_last_strides(
        tuple(weight.shape), weight.stride()
    ):
        return torch.channels_last
    return torch.contiguous_format


def problem(x_shape, w_shape, stride, padding, dilation, groups, dtype) -> ConvProblem:
    n, c, h, w = x_shape
    k, _, kh, kw = w_shape
    oh = (h + padding[0] + padding[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + padding[2] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return ConvProblem(
        n, c, h, w, k, kh, kw, oh, ow, tuple(stride), (padding[0], padding[2]), tuple(dilation),
        groups, dtype,
    )  # fmt: skip


def _precision(t: torch.Tensor) -> tuple[str | None, bool]:
    """(INPUT_PRECISION, UPCAST): float32 products in TF32 where PyTorch's convolution would
    use it (``torch.backends.cudnn.allow_tf32``, CUDA only); bf16 products in fp32 under the
    interpreter, whose tl.dot is wrong on bf16 operands."""
    if t.dtype != torch.float32:
        return None, t.dtype == torch.bfloat16 and interpreter_enabled()
    return ("tf32" if t.is_cuda and current_env().cudnn_tf32 else "ieee"), False


def _s(t: torch.Tensor) -> tuple[int, int, int, int]:
    return tuple(t.stride())


def _k_major(w: torch.Tensor) -> torch.Tensor:
    """The weight with unit stride along input channels (channels_last), so a B tile's
    reduction channels are one contiguous read; a copy (counted) when it is not already."""
    if w.stride(1) == 1 or w.shape[1] == 1:
        return w
    LAYOUT_COPIES.count += 1
    return w.contiguous(memory_format=torch.channels_last)


def _tma_device(device: torch.device) -> bool:
    """Tensor descriptors: the matmul family's test (Hopper or later), or the interpreter,
    which runs them too."""
    return interpreter_enabled() or tma_device(device)


def _tma_1x1(x: torch.Tensor, w: torch.Tensor, groups: int) -> bool:
    """Whether the 1x1 GEMM can load both operands by TMA: x dense NHWC (an (M, C) row-major
    matrix), the weight a (K, C) row-major one, rows 16-byte aligned."""
    _, c, h, wd = x.shape
    return (
        groups == 1
        and x.stride() == (h * wd * c, 1, wd * c, c)
        and (w.stride(0), w.stride(1)) == (c, 1)
        and c * x.element_size() % 16 == 0
        and x.data_ptr() % 16 == 0
        and w.data_ptr() % 16 == 0
        and _tma_device(x.device)
    )


def _dense_cl(t: torch.Tensor) -> bool:
    """Dense channels_last (NHWC memory, no gaps; a dimension of size 1 may have any stride)
    and 16-byte aligned."""
    _, c, h, w = t.shape
    want = (h * w * c, 1, w * c, c)
    return t.data_ptr() % 16 == 0 and all(
        size == 1 or have == need for size, have, need in zip(t.shape, t.stride(), want)
    )


def _tma_matrix(t: torch.Tensor, k: int) -> bool:
    """Whether ``t`` (an output or residual of k channels) is a dense (M, K) matrix a TMA
    descriptor can read and write: dense channels_last, rows of whole 16 bytes."""
    return k * t.element_size() % 16 == 0 and _dense_cl(t)


def _tma_conv(x: torch.Tensor, w: torch.Tensor, p: ConvProblem) -> bool:
    """Whether ``conv_fwd_tma_kernel`` can read this convolution (see kernels_tma.py): one
    group, the same stride 1 or 2 both ways (2: an even input, channels in blocks of 16),
    dense channels_last input and weight, rows of 16 bytes."""
    s = p.stride[0]
    elem = x.element_size()
    return (
        p.groups == 1
        and p.stride == (s, s)
        and (s == 1 or (s == 2 and p.h % 2 == 0 and p.w % 2 == 0 and p.c % 16 == 0))
        and p.c * elem % 16 == 0
        and p.k * elem % 16 == 0
        and _dense_cl(x)
        and _dense_cl(w)
        and _tma_device(x.device)
    )


def _gemm_1x1(x, w, residual, p: ConvProblem) -> bool:
    """Whether a 1x1 stride-1 convolution can run as the matmul family's GEMM over the pixels:
    x, the weight and the residual are (M, C), (K, C) and (M, K) row-major matrices in place."""
    return (
        p.pointwise
        and p.groups == 1
        and _dense_cl(x)
        and _dense_cl(w)
        and (residual is None or _dense_cl(residual))
    )


FORWARD_PATHS = ("depthwise", "1x1", "1x1-tma", "1x1-gemm", "rows", "fwd", "tma")


def _tune(kind: str, p: ConvProblem, cands, from_tuning, run, elem: int):
    def choose():
        best = _tuning.tune(
            f"conv_{kind}", p.key(kind), [c.tuning() for c in cands], lambda c: run(from_tuning(c)),
            prune=lambda c: fits(c, elem),
        )  # fmt: skip
        return from_tuning(best)

    return cached(f"conv.{kind}", p, choose)


def forward_path(p: ConvProblem) -> str:
    """The forward kernel: "depthwise" (direct), "1x1" (plain GEMM), "rows" (few input
    channels: a K step per window row, when the layout allows it) or "fwd" (implicit GEMM)."""
    if p.depthwise:
        return "depthwise"
    if p.pointwise:
        return "1x1"
    if p.groups == 1 and p.c < 16 and p.kw * p.c <= 64 and p.dilation[1] == 1:
        return "rows"
    return "fwd"


def _rows_layout(x: torch.Tensor, w: torch.Tensor) -> bool:
    """x's and the weight's window rows are contiguous (NHWC pixels C apart, channels_last
    weight), as the "rows" kernel reads them."""
    c, kw = x.shape[1], w.shape[3]
    return (x.stride(1), x.stride(3)) == (1, c) and (w.stride(1), w.stride(3), w.stride(2)) == (
        1, c, c * kw,
    )  # fmt: skip


def _sig(t: torch.Tensor | None) -> tuple | None:
    """What a plan depends on of a tensor: shape, strides, dtype, device, 16-byte alignment."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0


class _Plan:
    """One launcher's decisions for a signature of its arguments: the output's shape and
    layout, the copies to make, and the bound launch (``Kernel.bind``: the binder ran once,
    a call substitutes its tensors and calls the compiled launcher)."""

    __slots__ = ("copy_b", "copy_w", "fmt", "path", "reduce", "run", "shape", "split")


def conv_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    activation: str,
    config: GemmConfig | DepthwiseConfig | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """``act(conv2d(x, weight) + bias + residual)``; x (N, C, H, W), weight (K, C/g, KH, KW),
    bias (K,), residual shaped like the output; padding (top, bottom, left, right). A warm
    call is one plan lookup, the output's allocation and one bound launch. ``path`` forces
    one of ``FORWARD_PATHS`` (the workbench's variants; ValueError where it cannot run)."""
    key = (
        _sig(x), _sig(weight), _sig(bias), _sig(residual), tuple(stride), tuple(padding),
        tuple(dilation), groups, activation, config, path,
    )  # fmt: skip
    plan = cached(
        "conv.forward",
        key,
        lambda: _forward_plan(
            x, weight, bias, residual, stride, padding, dilation, groups, activation, config, path
        ),
    )
    if plan.copy_w:
        weight = _k_major(weight)
    if plan.copy_b:  # the kernels index the bias by channel
        LAYOUT_COPIES.count += 1
        bias = bias.contiguous()
    out = torch.empty(plan.shape, dtype=x.dtype, device=x.device, memory_format=plan.fmt)
    if plan.run is not None:
        plan.run(
            x, weight, out if bias is None else bias, out if residual is None else residual, out
        )
    return out


def choose_path(p: ConvProblem, x, w, residual=None, forced: str | None = None) -> str:
    """The forward kernel of this call (see ``forward_path``), given the layouts: the TMA
    implicit GEMM where the operands are dense channels_last on Hopper. A 1x1 stride-1 layer
    keeps the pointer GEMM: none of the other 1x1 kernels (TMA loads, the matmul family's
    persistent GEMM, the TMA implicit GEMM) beat it on most of ResNet-50's such layers, and
    it runs on every GPU; but one that adds a dense residual takes the TMA GEMM, whose
    epilogue reads the residual by descriptor (the measurements are in docs/performance.md,
    under Convolution)."""
    path = forward_path(p)
    if path == "rows" and not _rows_layout(x, w):
        path = "fwd"
    if path == "fwd" and _tma_conv(x, w, p):
        path = "tma"
    if (
        path == "1x1"
        and residual is not None
        and _tma_1x1(x, w, p.groups)
        and _tma_matrix(residual, p.k)
    ):
        path = "1x1-tma"
    if forced is None or forced == path:
        return path
    ok = {
        "fwd": not p.depthwise,
        "1x1": p.pointwise and not p.depthwise,
        "1x1-tma": p.pointwise and _tma_1x1(x, w, p.groups),
        "1x1-gemm": _gemm_1x1(x, w, residual, p),
        "rows": path == "rows",
        "tma": _tma_conv(x, w, p),
        "depthwise": p.depthwise,
    }
    if not ok.get(forced, False):
        raise ValueError(
            f"conv2d: path {forced!r} cannot run this convolution (one of {FORWARD_PATHS}; "
            f"the default here is {path!r})"
        )
    return forced


def _gemm_plan(x, w, bias, residual, out, p: ConvProblem, activation: str):
    """The 1x1 stride-1 convolution as the matmul family's GEMM: (M, C) pixels times the
    (K, C) weight's transpose into the (M, K) output, the epilogue ``act(. + bias +
    residual)``. A call passes the same views of its tensors through the GEMM plan's operand
    preparation (an fp32 IEEE GEMM copies its K-major B row-major)."""

    def rows(t, cols):  # (N, cols, H, W) dense channels_last as an (N * H * W, cols) view
        return t.permute(0, 2, 3, 1).reshape(p.m, cols)

    r2 = rows(residual, p.k) if residual is not None else None
    problem_ = Problem(
        matrix(rows(x, p.c)), matrix(w.reshape(p.k, p.c).t()), matrix(rows(out, p.k)), p.m,
        p.k, p.c,
    )  # fmt: skip
    epi = Epilogue(bias=bias, activation=activation, residual=r2, residual_first=True)
    gemm = build_plan(problem_, epi, "best", None, GEMM_OPTIONS)
    has_bias, has_res = bias is not None, residual is not None

    def run(x, w, b, r, o):
        a2, b2 = gemm.operands(rows(x, p.c), w.reshape(p.k, p.c).t())
        r2 = rows(r, p.k) if has_res else None
        gemm.launch(a2, b2, rows(o, p.k), (None, None, b if has_bias else None, r2, None))

    return run


def _forward_plan(
    x, weight, bias, residual, stride, padding, dilation, groups, activation, config, forced
):
    p = problem(x.shape, weight.shape, stride, padding, dilation, groups, x.dtype)
    plan = _Plan()
    plan.shape, plan.fmt = (p.n, p.k, p.oh, p.ow), output_format(x, weight)
    out = torch.empty(plan.shape, dtype=x.dtype, device=x.device, memory_format=plan.fmt)
    plan.copy_b = bias is not None and bias.stride(0) != 1
    if plan.copy_b:
        bias = bias.contiguous()
    plan.copy_w = not p.depthwise and weight.stride(1) != 1 and weight.shape[1] != 1
    w = weight.contiguous(memory_format=torch.channels_last) if plan.copy_w else weight
    path = choose_path(p, x, w, residual, forced)
    plan.path, plan.run = path, None
    if out.numel() == 0:
        return plan
    if path == "1x1-gemm":
        plan.run = _gemm_plan(x, w, bias, residual, out, p, activation)
        return plan
    res = residual if residual is not None else out
    tensors = (x, w, bias if bias is not None else out, res, out)
    epilogue = {
        "HAS_BIAS": bias is not None,
        "HAS_RES": residual is not None,
        "ACT": ACTIVATIONS[activation],
    }
    sx, sw, sr, so = _s(x), _s(w), _s(res), _s(out)
    geometry = (*p.stride, *p.padding, *p.dilation)
    precision, upcast = _precision(x)

    def launch_args(cfg):
        """(kernel, grid, args, meta) of the launch with ``cfg``."""
        if path == "depthwise":
            bh, bw = plane_tile(p, cfg.BLOCK_P)  # the same block of the plane as a TMA tile's
            nb = cfg.BLOCK_P // (bh * bw)
            tiles = cdiv(p.n, nb) * cdiv(p.oh, bh) * cdiv(p.ow, bw)
            grid = (tiles, cdiv(p.k, cfg.BLOCK_C))
            args = (
                *tensors, p.n, p.h, p.w, p.oh, p.ow, p.k, p.k // p.c, *sx, sw[0], sw[2], sw[3],
                *sr, *so, *geometry,
            )  # fmt: skip
            meta = {**epilogue, "KH": p.kh, "KW": p.kw, "BH": bh, "BW": bw,
                    "BLOCK_P": cfg.BLOCK_P, "BLOCK_C": cfg.BLOCK_C,
                    "num_warps": cfg.num_warps}  # fmt: skip
            return depthwise_kernel, grid, args, meta
        grid = (cdiv(p.m, cfg.BLOCK_M) * cdiv(p.k_g, cfg.BLOCK_N), groups)
        meta = {
            **epilogue, "INPUT_PRECISION": precision, "UPCAST": upcast,
            "BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "BLOCK_K": cfg.BLOCK_K,
            "GROUP_M": cfg.GROUP_M, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
        }  # fmt: skip
        if path == "1x1-tma":
            args = (*tensors, p.m, p.oh, p.ow, p.c, p.k, *sr, *so)
            dense = _tma_matrix(out, p.k) and (residual is None or _tma_matrix(residual, p.k))
            return conv1x1_tma_kernel, grid, args, {**meta, "OUT_TMA": dense}
        if path == "tma":
            bh, bw = plane_tile(p, cfg.BLOCK_M)
            nb = cfg.BLOCK_M // (bh * bw)
            tiles = cdiv(p.n, nb) * cdiv(p.oh, bh) * cdiv(p.ow, bw) * cdiv(p.k, cfg.BLOCK_N)
            # At stride 2 a K block never crosses into the other column phase's channels.
            block_k = math.gcd(cfg.BLOCK_K, p.c) if p.stride[0] == 2 else cfg.BLOCK_K
            split = fwd_splits(tiles, p.kh * p.kw * cdiv(p.c, block_k), sms)
            target = tensors if split == 1 else (*tensors[:4], _workspace(split))
            args = (*target, p.n, p.h, p.w, p.c, p.oh, p.ow, p.k, *p.padding, *p.dilation, *sr)
            meta.update(S=p.stride[0], KH=p.kh, KW=p.kw, BH=bh, BW=bw, SPLIT=split,
                        W_FLAT=p.c % block_k == 0, BLOCK_K=block_k)  # fmt: skip
            return conv_fwd_tma_kernel, (tiles, split), args, meta
        if path == "1x1":
            args = (*tensors, p.m, p.oh, p.ow, p.c_g, p.k_g, *sx, sw[0], sw[1], *sr, *so)
            return conv1x1_kernel, grid, args, meta
        if path == "rows":
            meta["BLOCK_K"] = max(16, next_power_of_2(p.kw * p.c))  # one window row per step
            args = (
                *tensors, p.m, p.h, p.w, p.oh, p.ow, p.c, p.k, sx[0], sx[2], sw[0], sw[2], *sr,
                *so, *p.stride, *p.padding, p.dilation[0],
            )  # fmt: skip
            return conv_fwd_rows_kernel, grid, args, {**meta, "KH": p.kh, "ROW": p.kw * p.c}
        args = (
            *tensors, p.m, p.h, p.w, p.oh, p.ow, p.c_g, p.k_g, *sx, *sw, *sr, *so, *geometry,
        )  # fmt: skip
        return conv_fwd_kernel, grid, args, {**meta, "KH": p.kh, "KW": p.kw}

    sms = sm_count(x.device)

    def _workspace(split):
        return torch.empty(split * p.m * p.k, dtype=torch.float32, device=x.device)

    def reduce_args(split, ws):
        """The split reduction's launch: the slabs' sum, then the epilogue, into out."""
        bm, bn = (16, 32) if interpreter_enabled() else (64, 64)
        grid = (cdiv(p.m, bm), cdiv(p.k, bn))
        args = (ws, *tensors[2:], p.m, p.oh, p.ow, p.k, p.m * p.k, *sr, *so)
        meta = {**epilogue, "SPLIT": split, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4}
        return grid, args, meta

    def run(cfg):
        kern, grid, args, meta = launch_args(cfg)
        kern[grid](*args, **meta)
        if meta.get("SPLIT", 1) > 1:
            grid, args, meta = reduce_args(meta["SPLIT"], args[4])
            split_epilogue_kernel[grid](*args, **meta)

    kind = path
    if path == "depthwise":
        cands, from_tuning = DepthwiseConfig.candidates(p), DepthwiseConfig.from_tuning
    else:
        cands, from_tuning = GemmConfig.candidates(p, p.c_g, p.k_g), GemmConfig.from_tuning
    cfg = config or _tune(kind, p, cands, from_tuning, run, x.element_size())
    kern, grid, args, meta = launch_args(cfg)
    main = kern.bind(grid, *args, **meta)
    split = meta.get("SPLIT", 1)
    if split == 1:
        plan.run = main
        return plan
    grid, args, meta = reduce_args(split, args[4])
    reduce = split_epilogue_kernel.bind(grid, *args, **meta)
    numel, device = split * p.m * p.k, x.device

    def run_split(x, w, b, r, o):
        ws = torch.empty(numel, dtype=torch.float32, device=device)
        main(x, w, b, r, ws)
        reduce(ws, b, r, o)

    plan.run = run_split
    return plan


def _dgrad_key(grad, weight, x_shape, stride, padding, dilation, groups, config) -> tuple:
    return (
        _sig(grad), _sig(weight), tuple(x_shape), tuple(stride), tuple(padding), tuple(dilation),
        groups, config,
    )  # fmt: skip


def _wgrad_key(grad, x, w_shape, stride, padding, dilation, groups, config) -> tuple:
    return (
        _sig(grad), _sig(x), tuple(w_shape), tuple(stride), tuple(padding), tuple(dilation),
        groups, config,
    )  # fmt: skip


class _BackwardPlan:
    """The plans of one backward's launchers (None where that gradient is not needed)."""

    __slots__ = ("bias", "dgrad", "wgrad")


def conv_backward(
    dz: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int, int, int],
    dilation: tuple[int, int],
    groups: int,
    needs: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dw, db) from ``dz`` (the gradient of the pre-activation output) where ``needs``
    says so: ``conv_dgrad``, ``conv_wgrad`` and ``bias_grad`` (their plans, the same
    objects) behind one plan lookup, so that a warm backward costs one key and one Env
    snapshot. The plain eager path of ``ConvFunction.backward``."""
    key = (_sig(dz), _sig(x), _sig(weight), stride, padding, dilation, groups, needs)
    plan = cached(
        "conv.backward",
        key,
        lambda: _backward_plan(dz, x, weight, stride, padding, dilation, groups, needs),
    )
    dx = dw = db = None
    if plan.dgrad is not None:
        dx = _run_dgrad(plan.dgrad, dz, weight)
    if plan.wgrad is not None:
        dw = _run_wgrad(plan.wgrad, dz, x)
    if plan.bias is not None:
        db = _run_bias_grad(plan.bias, dz)
    return dx, dw, db


def _backward_plan(dz, x, weight, stride, padding, dilation, groups, needs):
    plan = _BackwardPlan()
    plan.dgrad = plan.wgrad = plan.bias = None
    geo = (stride, padding, dilation, groups)
    if needs[0]:
        x_shape = tuple(x.shape)
        plan.dgrad = cached(
            "conv.dgrad",
            _dgrad_key(dz, weight, x_shape, *geo, None),
            lambda: _dgrad_plan(dz, weight, x_shape, *geo, None),
        )
    if needs[1]:
        w_shape = tuple(weight.shape)
        plan.wgrad = cached(
            "conv.wgrad",
            _wgrad_key(dz, x, w_shape, *geo, None),
            lambda: _wgrad_plan(dz, x, w_shape, *geo, None),
        )
    if needs[2]:
        plan.bias = cached("conv.bias_grad", _sig(dz), lambda: _bias_grad_plan(dz))
    return plan


def conv_dgrad(
    grad: torch.Tensor,
    weight: torch.Tensor,
    x_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """The input gradient of the convolution, from the output gradient ``grad``."""
    key = _dgrad_key(grad, weight, x_shape, stride, padding, dilation, groups, config)
    plan = cached(
        "conv.dgrad",
        key,
        lambda: _dgrad_plan(grad, weight, x_shape, stride, padding, dilation, groups, config),
    )
    return _run_dgrad(plan, grad, weight)


def _run_dgrad(plan: _Plan, grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if plan.copy_w:
        weight = _k_major(weight)
    dx = torch.empty(plan.shape, dtype=grad.dtype, device=grad.device, memory_format=plan.fmt)
    if plan.run is not None:
        plan.run(grad, weight, dx)
    elif plan.path == "zero":
        dx.zero_()
    return dx


def _dgrad_plan(grad, weight, x_shape, stride, padding, dilation, groups, config):
    p = problem(x_shape, weight.shape, stride, padding, dilation, groups, grad.dtype)
    plan = _Plan()
    plan.shape, plan.fmt = tuple(x_shape), output_format(grad, weight)
    plan.copy_w = weight.stride(1) != 1 and weight.shape[1] != 1
    w = weight.contiguous(memory_format=torch.channels_last) if plan.copy_w else weight
    dx = torch.empty(plan.shape, dtype=grad.dtype, device=grad.device, memory_format=plan.fmt)
    plan.run, plan.path = None, "none"
    if dx.numel() == 0:
        return plan
    if grad.numel() == 0:  # no output pixel: nothing flows back
        plan.path = "zero"
        return plan
    precision, upcast = _precision(grad)
    m = p.n * p.h * p.w
    phases = p.stride != (1, 1) and p.dilation == (1, 1)
    strides = (*_s(grad), *_s(w), *_s(dx))

    def launch_args(cfg):
        meta = {
            "KH": p.kh, "KW": p.kw, "INPUT_PRECISION": precision, "UPCAST": upcast,
            "BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "BLOCK_K": cfg.BLOCK_K,
            "GROUP_M": cfg.GROUP_M, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
        }  # fmt: skip
        if phases:  # one dense implicit GEMM per stride phase (see conv_dgrad_phase_kernel)
            rows = p.n * cdiv(p.h, p.stride[0]) * cdiv(p.w, p.stride[1])
            tiles = cdiv(rows, cfg.BLOCK_M) * cdiv(p.c_g, cfg.BLOCK_N)
            grid = (tiles, groups, p.stride[0] * p.stride[1])
            args = (grad, w, dx, p.h, p.w, p.oh, p.ow, p.c_g, p.k_g, *strides, *p.padding, p.n)
            meta.update(SH=p.stride[0], SW=p.stride[1])
            return conv_dgrad_phase_kernel, grid, args, meta
        grid = (cdiv(m, cfg.BLOCK_M) * cdiv(p.c_g, cfg.BLOCK_N), groups)
        args = (
            grad, w, dx, m, p.h, p.w, p.oh, p.ow, p.c_g, p.k_g, *strides, *p.stride, *p.padding,
            *p.dilation,
        )  # fmt: skip
        return conv_dgrad_kernel, grid, args, meta

    def run(cfg):
        kern, grid, args, meta = launch_args(cfg)
        kern[grid](*args, **meta)

    cands = GemmConfig.candidates(p._replace(oh=p.h, ow=p.w), p.k_g, p.c_g)
    cfg = config or _tune("dgrad", p, cands, GemmConfig.from_tuning, run, grad.element_size())
    kern, grid, args, meta = launch_args(cfg)
    plan.run, plan.path = kern.bind(grid, *args, **meta), "dgrad"
    return plan


def conv_wgrad(
    grad: torch.Tensor,
    x: torch.Tensor,
    w_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    config: WgradConfig | None = None,
) -> torch.Tensor:
    """The weight gradient (K, C/g, KH, KW), laid out as PyTorch's (channels_last when x is).
    A split reduction stores each split's fp32 partial sums in a slab of its own (an
    allocation, no fill), added in a fixed order and rounded once by a second kernel."""
    key = _wgrad_key(grad, x, w_shape, stride, padding, dilation, groups, config)
    plan = cached(
        "conv.wgrad",
        key,
        lambda: _wgrad_plan(grad, x, w_shape, stride, padding, dilation, groups, config),
    )
    return _run_wgrad(plan, grad, x)


def _run_wgrad(plan: _Plan, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    dw = torch.empty(plan.shape, dtype=x.dtype, device=x.device, memory_format=plan.fmt)
    if plan.run is None:
        return dw.zero_() if plan.path == "zero" else dw
    if plan.split == 1:
        plan.run(grad, x, dw)
        return dw
    partial = torch.empty(plan.split * dw.numel(), dtype=torch.float32, device=x.device)
    plan.run(grad, x, partial)
    plan.reduce(partial, dw)
    return dw


def _wgrad_plan(grad, x, w_shape, stride, padding, dilation, groups, config):
    p = problem(x.shape, w_shape, stride, padding, dilation, groups, x.dtype)
    plan = _Plan()
    plan.shape, plan.fmt = tuple(w_shape), output_format(x, grad)
    plan.run, plan.path, plan.split = None, "none", 1
    if math.prod(w_shape) == 0:
        return plan
    if p.m == 0:
        plan.path = "zero"
        return plan
    precision, upcast = _precision(x)
    sms = sm_count(x.device)

    def launch_args(cfg, target):
        split = cfg.splits(p, sms)
        per_split = cdiv(cdiv(p.m, split), cfg.BLOCK_K) * cfg.BLOCK_K
        grid = (cdiv(p.k_g, cfg.BLOCK_M) * cdiv(p.c_g, cfg.BLOCK_N), p.kh * p.kw, groups * split)
        args = (
            grad, x, target, p.m, p.h, p.w, p.oh, p.ow, p.c_g, p.k_g, *_s(grad), *_s(x),
            *dense_strides, *p.stride, *p.padding, *p.dilation, per_split, numel,
        )  # fmt: skip
        meta = {
            "KW": p.kw, "SPLIT": split, "INPUT_PRECISION": precision, "UPCAST": upcast,
            "BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "BLOCK_K": cfg.BLOCK_K,
            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
        }  # fmt: skip
        return split, grid, args, meta

    # The output's strides (dense, plan.fmt): a split's slab of fp32 partial sums has them too.
    probe = torch.empty(w_shape, dtype=x.dtype, device=x.device, memory_format=plan.fmt)
    dense_strides, numel = _s(probe), probe.numel()

    def target_for(split):
        if split == 1:
            return torch.empty(w_shape, dtype=x.dtype, device=x.device, memory_format=plan.fmt)
        return torch.empty(split * numel, dtype=torch.float32, device=x.device)

    def run(cfg):
        split = cfg.splits(p, sms)
        target = target_for(split)
        _, grid, args, meta = launch_args(cfg, target)
        conv_wgrad_kernel[grid](*args, **meta)
        if split > 1:
            _split_sum(target, probe, split)

    cands = WgradConfig.candidates(p)
    cfg = config or _tune("wgrad", p, cands, WgradConfig.from_tuning, run, x.element_size())
    split = cfg.splits(p, sms)
    target = target_for(split)
    split, grid, args, meta = launch_args(cfg, target)
    plan.run, plan.path, plan.split = conv_wgrad_kernel.bind(grid, *args, **meta), "wgrad", split
    plan.reduce = _split_sum_bound(target, probe, split) if split > 1 else None
    return plan


_SUM_BLOCK = 1024


def _split_sum(partial: torch.Tensor, out: torch.Tensor, split: int) -> None:
    """``out`` (dense) = the sum of ``partial``'s ``split`` fp32 slabs, rounded once."""
    numel = out.numel()
    split_sum_kernel[(cdiv(numel, _SUM_BLOCK),)](
        partial, out, numel, split, BLOCK=_SUM_BLOCK, num_warps=4
    )


def _split_sum_bound(partial: torch.Tensor, out: torch.Tensor, split: int):
    """``_split_sum`` as a bound launch (a plan's: a warm call runs no binder); called with
    (partial, out). A kernel, not ``torch.sum``, so that a replayed call (replay.py) can
    redo it."""
    numel = out.numel()
    return split_sum_kernel.bind(
        (cdiv(numel, _SUM_BLOCK),), partial, out, numel, split, BLOCK=_SUM_BLOCK, num_warps=4
    )


def bias_grad(dz: torch.Tensor) -> torch.Tensor:
    """db[c] = the sum of dz (N, C, OH, OW) over everything but C, in dz's dtype."""
    plan = cached("conv.bias_grad", _sig(dz), lambda: _bias_grad_plan(dz))
    return _run_bias_grad(plan, dz)


def _run_bias_grad(plan: _Plan, dz: torch.Tensor) -> torch.Tensor:
    db = torch.empty(plan.shape, dtype=dz.dtype, device=dz.device)
    if plan.run is None:
        return db.zero_()
    if plan.split == 1:
        plan.run(dz, db)
        return db
    partial = torch.empty(plan.split * plan.shape[0], dtype=torch.float32, device=dz.device)
    plan.run(dz, partial)
    plan.reduce(partial, db)
    return db


def _bias_grad_plan(dz):
    n, c, oh, ow = dz.shape
    m = n * oh * ow
    plan = _Plan()
    plan.shape, plan.run, plan.split = (c,), None, 1
    if m == 0 or c == 0:
        return plan
    block_c = 32 if interpreter_enabled() else 64
    block_m = 16 if interpreter_enabled() else 64
    # The splits' partial sums are added in a fixed order: deterministic mode splits too.
    split = max(1, min(64, m // (16 * block_m)))
    per_split = cdiv(cdiv(m, split), block_m) * block_m
    target = torch.empty(
        c * split, dtype=dz.dtype if split == 1 else torch.float32, device=dz.device
    )
    plan.split = split
    if split > 1:
        plan.reduce = _split_sum_bound(
            target, torch.empty(c, dtype=dz.dtype, device=dz.device), split
        )
    plan.run = bias_grad_kernel.bind(
        (cdiv(c, block_c), split), dz, target, m, oh, ow, c, *_s(dz), per_split, SPLIT=split,
        BLOCK_M=block_m, BLOCK_C=block_c, num_warps=4,
    )  # fmt: skip
    return plan


def act_backward(grad: torch.Tensor, src: torch.Tensor, activation: str) -> torch.Tensor:
    """dz = grad * act'(z): ``src`` is the output for relu, the pre-activation otherwise."""
    if grad.stride() != src.stride():
        LAYOUT_COPIES.count += 1
        grad = torch.empty_like(src).copy_(grad)
    dz = torch.empty_like(src)
    if dz.numel():
        key = (_sig(grad), _sig(src), activation)
        cached("conv.act_grad", key, lambda: _act_grad_launch(grad, src, dz, activation))(
            grad, src, dz
        )
    return dz


def _act_grad_launch(grad, src, dz, activation):
    """The bound launch of ``act_grad_kernel`` over ``src``'s elements (a plan's: a warm call
    runs no binder)."""
    numel, block = src.numel(), 1024
    return act_grad_kernel.bind(
        (cdiv(numel, block),), grad, src, dz, numel, ACT=ACTIVATIONS[activation], BLOCK=block,
        num_warps=4,
    )  # fmt: skip


def conv_direct(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    activation: str,
) -> torch.Tensor:
    """The workbench's ``direct`` variant: ``act(conv2d + bias)`` by the loop nest on the CUDA
    cores (``conv_direct_kernel``), no tensor cores, no plan (a variant is timed, not served)."""
    p = problem(x.shape, weight.shape, stride, padding, dilation, groups, x.dtype)
    out = torch.empty(
        (p.n, p.k, p.oh, p.ow), dtype=x.dtype, device=x.device,
        memory_format=output_format(x, weight),
    )  # fmt: skip
    if out.numel() == 0:
        return out
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    bm, bn = (32, 16) if interpreter_enabled() else (64, 64)
    grid = (cdiv(p.m, bm), cdiv(p.k_g, bn), groups)
    conv_direct_kernel[grid](
        x, weight, out if bias is None else bias, out, p.m, p.h, p.w, p.oh, p.ow, p.c_g, p.k_g,
        *_s(x), *_s(weight), *_s(out), *p.stride, *p.padding, *p.dilation, KH=p.kh, KW=p.kw,
        HAS_BIAS=bias is not None, ACT=ACTIVATIONS[activation], BLOCK_M=bm, BLOCK_N=bn,
        num_warps=4,
    )  # fmt: skip
    return out


def im2col(
    x: torch.Tensor,
    w_shape: tuple[int, ...],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    """The patch matrix of the ``im2col`` variant: (groups, N*OH*OW, KH*KW*C/groups), column
    ``(kh * KW + kw) * C/groups + c`` (the implicit GEMM's K order), zeros in the padding."""
    p = problem(x.shape, w_shape, stride, padding, dilation, groups, x.dtype)
    k_cols = p.kh * p.kw * p.c_g
    cols = torch.empty((groups, p.m, k_cols), dtype=x.dtype, device=x.device)
    if cols.numel() == 0:
        return cols
    bm, bk = (16, 16) if interpreter_enabled() else (64, 64)
    im2col_kernel[(cdiv(p.m, bm), cdiv(k_cols, bk), groups)](
        x, cols, p.m, p.h, p.w, p.oh, p.ow, p.c_g, k_cols, *_s(x), cols.stride(0),
        cols.stride(1), *p.stride, *p.padding, *p.dilation, KW=p.kw, BLOCK_M=bm, BLOCK_K=bk,
        num_warps=4,
    )  # fmt: skip
    return cols


def winograd(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    padding: list[int],
    activation: str,
) -> torch.Tensor:
    """The workbench's Winograd F(2x2, 3x3) variant: ``act(conv2d + bias)`` of a 3x3, stride-1,
    undilated, ungrouped convolution; padding (top, bottom, left, right). V (the input patches'
    transforms) and U (the filters') are stored in x's dtype, the 16 GEMMs (``matmul``) keep
    their products in fp32 for the output transform. No plan: a variant is timed, not
    served."""
    n, c, h, w = x.shape
    k = weight.shape[0]
    if tuple(weight.shape[1:]) != (c, 3, 3):
        raise ValueError(
            f"winograd: F(2x2, 3x3) takes a 3x3 filter over every input channel (groups 1), "
            f"got weight {tuple(weight.shape)} for {c} input channels"
        )
    oh, ow = h + padding[0] + padding[1] - 2, w + padding[2] + padding[3] - 2
    out = torch.empty(
        (n, k, max(oh, 0), max(ow, 0)), dtype=x.dtype, device=x.device,
        memory_format=output_format(x, weight),
    )  # fmt: skip
    if out.numel() == 0:
        return out
    th, tw = cdiv(oh, 2), cdiv(ow, 2)
    t = n * th * tw
    v = torch.empty((16, t, c), dtype=x.dtype, device=x.device)
    u = torch.empty((16, c, k), dtype=x.dtype, device=x.device)
    bt, bc = (16, 16) if interpreter_enabled() else (64, 64)
    winograd_input_kernel[(cdiv(t, bt), cdiv(c, bc))](
        x, v, t, th, tw, c, h, w, *_s(x), padding[0], padding[2], t * c, BLOCK_T=bt, BLOCK_C=bc,
        num_warps=4,
    )  # fmt: skip
    winograd_weight_kernel[(cdiv(k * c, 256),)](
        weight, u, k, c, *_s(weight), BLOCK=256, num_warps=4
    )
    m = matmul_fwd(v, u, torch.float32)
    winograd_output_kernel[(cdiv(t, bt), cdiv(k, bc))](
        m, bias if bias is not None else m, out, t, th, tw, k, oh, ow, *_s(out), t * k,
        HAS_BIAS=bias is not None, ACT=ACTIVATIONS[activation], BLOCK_T=bt, BLOCK_K=bc,
        num_warps=4,
    )  # fmt: skip
    return out
