"""``tritonkit.optim.Muon`` and ``MuonW``: ``torch.optim.Muon``'s update, batched per shape."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from tritonkit.ops.optim.config import (
    NS_COEFFICIENTS,
    NS_STEPS,
    ChunkConfig,
    NSConfig,
    choose_ns_config,
)
from tritonkit.ops.optim.kernels_muon import N_ROWS, ROW_BUF, ROW_G, ROW_O, ROW_P, ROW_X
from tritonkit.ops.optim.plan import (
    NSWorkspace,
    TensorTable,
    launch_apply,
    launch_momentum,
    launch_normalize,
    newton_schulz_,
    upload,
)
from tritonkit.optim._base import (
    FusedOptimizer,
    GradRow,
    check_hyper,
    check_lr,
    check_params,
    device_groups,
    state_like,
)
from tritonkit.optim.adam import AdamPlan, check_adam_group

ADJUST_LR_FNS = (None, "original", "match_rms_adamw")


def adjust_lr_ratio(adjust_lr_fn: str | None, rows: int, cols: int) -> float:
    """``torch.optim.Muon``'s learning-rate factor for a ``rows x cols`` matrix:
    sqrt(max(1, rows / cols)) ("original", the default) or 0.2 sqrt(max(rows, cols))
    ("match_rms_adamw": the update's RMS matches AdamW's, so AdamW's lr and decay carry over)."""
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols))


def _matrix_shape(p: torch.Tensor) -> tuple[int, int]:
    """A >= 2-D parameter as the matrix Muon orthogonalizes: (shape[0], the rest flattened)."""
    return p.shape[0], p.numel() // p.shape[0]


class MuonPlan:
    """One Muon param group's matrices of one (device, dtype): a multi-tensor table for the
    elementwise passes and one Newton-Schulz workspace per matrix shape."""

    __slots__ = (
        "chunks",
        "flags",
        "grads",
        "index",
        "norms",
        "ns_configs",
        "ns_steps",
        "p_dtype",
        "params",
        "partials",
        "ratios",
        "table",
        "workspaces",
    )
    grad_row = ROW_G

    def __init__(
        self,
        opt: FusedOptimizer,
        group: dict[str, Any],
        entries: list[tuple[int, torch.Tensor]],
    ) -> None:
        self.index = [i for i, _ in entries]
        self.params = params = [p for _, p in entries]
        p0 = params[0]
        device = p0.device
        self.p_dtype = p0.dtype
        self.ns_steps = group["ns_steps"]
        states = [opt.state[p] for p in params]
        for p, st in zip(params, states):
            st["momentum_buffer"] = state_like(p, st.get("momentum_buffer"), p.dtype)
        # Same-shape matrices share a batch: slot b of their workspace.
        batches: dict[tuple[int, int], list[int]] = {}
        for k, p in enumerate(params):
            batches.setdefault(_matrix_shape(p), []).append(k)
        self.workspaces = []
        self.ns_configs = []  # the GEMM config of each workspace's batch
        x_ptrs = [0] * len(params)
        o_ptrs = [0] * len(params)
        for (rows, cols), members in batches.items():
            ws = NSWorkspace(len(members), rows, cols, device)
            self.workspaces.append(ws)
            self.ns_configs.append(
                opt.ns_config or choose_ns_config(len(members), rows, cols, device)
            )
            out = ws.result(self.ns_steps)
            for b, k in enumerate(members):
                x_ptrs[k] = ws.x[b].data_ptr()
                o_ptrs[k] = out[b].data_ptr()
        self.chunks = opt.chunks_for(device, p0.dtype)
        table = self.table = TensorTable(
            N_ROWS, [p.numel() for p in params], device, self.chunks.block
        )
        table.set_row(ROW_P, params)
        table.set_row(ROW_BUF, [st["momentum_buffer"] for st in states])
        table.set_row_ptrs(ROW_X, tuple(x_ptrs))
        table.set_row_ptrs(ROW_O, tuple(o_ptrs))
        ratios = [adjust_lr_ratio(group["adjust_lr_fn"], *_matrix_shape(p)) for p in params]
        self.ratios = upload(torch.tensor(ratios, dtype=torch.float32), device)
        self.partials = torch.empty(table.n_chunks, dtype=torch.float32, device=device)
        self.norms = torch.empty(len(params), dtype=torch.float32, device=device)
        self.grads = GradRow(opt.op, table, ROW_G, params)
        self.flags = torch.zeros(len(params), dtype=torch.float32, device=device)

    def launch(
        self,
        opt: FusedOptimizer,
        group: dict[str, Any],
        flag: torch.Tensor | None,
        grad_scale: torch.Tensor | None,
    ) -> None:
        chunks = self.chunks
        launch_momentum(
            self.table,
            self.partials,
            self.p_dtype,
            group["momentum"],
            group["nesterov"],
            flag,
            grad_scale,
            chunks,
        )
        launch_normalize(self.table, self.partials, self.norms, group[opt.ns_eps_key], flag, chunks)
        coefficients = tuple(group["ns_coefficients"])
        for ws, ns_config in zip(self.workspaces, self.ns_configs):
            newton_schulz_(ws, self.ns_steps, coefficients, ns_config)
        lr = group["lr"]
        if isinstance(lr, torch.Tensor) and lr.device != self.table.device:
            lr = lr.item()
        launch_apply(self.table, self.ratios, self.p_dtype, lr, group["weight_decay"], flag, chunks)


def check_muon_group(op: str, gi: int, group: dict[str, Any], eps_key: str) -> None:
    """Muon's hyperparameters (ValueError naming the one out of range) and parameters (>= 2-D)."""
    check_lr(op, group["lr"])
    check_hyper(op, "momentum", group["momentum"], 0.0 <= group["momentum"] < 1.0, "in [0, 1)")
    wd = group["weight_decay"]
    check_hyper(op, "weight_decay", wd, wd >= 0, ">= 0")
    check_hyper(op, eps_key, group[eps_key], group[eps_key] > 0, "> 0")
    steps = group["ns_steps"]
    check_hyper(op, "ns_steps", steps, isinstance(steps, int) and 0 <= steps < 100, "in [0, 100)")
    coefficients = group["ns_coefficients"]
    check_hyper(op, "ns_coefficients", coefficients, len(coefficients) == 3, "3 numbers (a, b, c)")
    fn = group["adjust_lr_fn"]
    check_hyper(op, "adjust_lr_fn", fn, fn in ADJUST_LR_FNS, f"one of {list(ADJUST_LR_FNS)}")
    for i, p in enumerate(group["params"]):
        if p.dim() < 2:
            raise ValueError(
                f"{op}: param_groups[{gi}]['params'][{i}] must have at least 2 dimensions "
                f"(Muon orthogonalizes matrices; conv weights are flattened to (out, rest)), "
                f"got shape {tuple(p.shape)}"
            )
        if p.shape[0] > 1 and p.stride(0) != p.numel() // p.shape[0]:
            raise ValueError(
                f"{op}: param_groups[{gi}]['params'][{i}] must keep its first dimension "
                f"outermost in memory (Muon reads it as (shape[0], rest) rows), got strides "
                f"{p.stride()} for shape {tuple(p.shape)}"
            )
    check_params(op, gi, group["params"])


class Muon(FusedOptimizer):
    """``torch.optim.Muon``: momentum, then the update orthogonalized by Newton-Schulz.

    Per matrix (``torch.optim.Muon``'s algorithm): ``buf = lerp(buf, g, 1 - momentum)``;
    ``u = lerp(g, buf, momentum)`` (Nesterov) or ``buf``; ``u`` in bfloat16 divided by its
    Frobenius norm; ``ns_steps`` Newton-Schulz iterations in bfloat16 (on the transpose when
    rows > cols); ``p *= 1 - lr * weight_decay``; ``p -= lr * ratio * u`` with ``ratio`` from
    ``adjust_lr_fn``. Parameters with more than 2 dimensions (conv weights) are taken as
    ``(shape[0], rest)`` matrices, where ``torch.optim.Muon`` accepts only 2-D ones.

    Each step is a few launches per param group, whatever its number of matrices: momentum,
    norms and update are multi-tensor passes, and the Newton-Schulz products of same-shape
    matrices run as one batch (3 launches per iteration per shape), on a GEMM that computes
    only one triangle of the symmetric products. The state (``momentum_buffer``) has
    ``torch.optim.Muon``'s layout, so ``state_dict`` moves both ways.

    Args:
        params: >= 2-D parameters or param groups (CUDA; float32, float16 or bfloat16).
        lr, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps, adjust_lr_fn:
            as ``torch.optim.Muon`` (``eps`` clamps the norm; must be > 0).
        nonfinite: ``"skip"`` (default: no host sync), ``"raise"`` (one sync per step) or
            ``"propagate"``, as for ``tritonkit.optim.Adam``.
        chunks: the elementwise passes' launch config (None: as for ``Adam``).
        ns_config: the Newton-Schulz GEMM's tiles and paths; None: per batch of same-shape
            matrices, this GPU's shipped table row for the shape, else a heuristic
            (``newton_schulz.choose_ns_config``).
    """

    op = "tritonkit.optim.Muon"
    ns_eps_key = "eps"

    def __init__(
        self,
        params: Any,
        lr: float | torch.Tensor = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = NS_STEPS,
        adjust_lr_fn: str | None = None,
        *,
        nonfinite: str = "skip",
        chunks: ChunkConfig | None = None,
        ns_config: NSConfig | None = None,
    ) -> None:
        self.ns_config = ns_config  # None: chosen per batch shape
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": ns_coefficients,
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
        }
        super().__init__(params, defaults, nonfinite, chunks)

    def _check_group(self, gi: int, group: dict[str, Any]) -> None:
        check_muon_group(self.op, gi, group, self.ns_eps_key)

    def _plan_key(self, group: dict[str, Any]) -> tuple:
        return (group["ns_steps"], group["adjust_lr_fn"])

    def _make_plans(
        self, group: dict[str, Any], entries: list[tuple[int, torch.Tensor]]
    ) -> list[MuonPlan]:
        return [MuonPlan(self, group, e) for e in device_groups(entries).values()]


_HEAD_NAMES = ("lm_head", "head", "classifier", "output_projection")


def muon_param_groups(
    model: torch.nn.Module,
    head_names: Iterable[str] = _HEAD_NAMES,
    **muon_options: Any,
) -> list[dict[str, Any]]:
    """Split a model's parameters the usual Muon way: hidden >= 2-D weights to Muon
    (``use_muon=True``), everything else to AdamW: biases and norm weights (< 2-D), every
    ``nn.Embedding`` weight, and the weights of modules named like an output head
    (``head_names``, matched against the last component of the module name, e.g. ``lm_head``).
    A parameter shared by several modules (tied embeddings) goes to AdamW if any of them says so.

    Args:
        model: the module whose ``named_modules`` are walked.
        head_names: module names taken for output heads.
        muon_options: extra keys for the Muon group (e.g. ``lr=0.02``).

    Returns:
        ``[{"params": [...], "use_muon": True, **muon_options}, {"params": [...],
        "use_muon": False}]``, empty groups left out, parameters in ``model.parameters()``
        order; pass it to ``MuonW``.
    """
    heads = set(head_names)
    to_adam: set[int] = set()
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Embedding) or last in heads:
            to_adam.update(id(p) for p in module.parameters(recurse=False))
    muon, adam = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (adam if p.dim() < 2 or id(p) in to_adam else muon).append(p)
    groups = []
    if muon:
        groups.append({"params": muon, "use_muon": True, **muon_options})
    if adam:
        groups.append({"params": adam, "use_muon": False})
    return groups


class MuonW(FusedOptimizer):
    """Muon on hidden matrices and AdamW on the rest, in one optimizer.

    Each param group says which with ``use_muon``: True groups take Muon's update (keys
    ``momentum``, ``nesterov``, ``ns_coefficients``, ``ns_eps``, ``ns_steps``,
    ``adjust_lr_fn``), False groups AdamW's (``betas``, ``eps``, ``amsgrad``, ``maximize``);
    both take ``lr`` and ``weight_decay``. ``muon_param_groups(model)`` makes the usual split
    (embeddings, output head, norms and biases to AdamW). Parameters given without groups
    are split by dimension only: >= 2-D to Muon. The default ``adjust_lr_fn`` is
    ``"match_rms_adamw"``, under which one ``lr`` and ``weight_decay`` serve both halves
    (Moonshot's recipe, "Muon is Scalable for LLM Training").

    Args:
        params: param groups with ``use_muon``, or parameters.
        lr, weight_decay: for both kinds of group.
        momentum, nesterov, ns_coefficients, ns_eps, ns_steps, adjust_lr_fn: Muon's.
        betas, eps, amsgrad, maximize: AdamW's.
        nonfinite, chunks, ns_config: as for ``Muon``.
    """

    op = "tritonkit.optim.MuonW"
    ns_eps_key = "ns_eps"
    master_weights = False
    _group_defaults: ClassVar[dict[str, Any]] = {
        "amsgrad": False,
        "maximize": False,
        "decoupled_weight_decay": True,
    }

    def __init__(
        self,
        params: Any,
        lr: float | torch.Tensor = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        ns_eps: float = 1e-7,
        ns_steps: int = NS_STEPS,
        adjust_lr_fn: str | None = "match_rms_adamw",
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        amsgrad: bool = False,
        maximize: bool = False,
        *,
        nonfinite: str = "skip",
        chunks: ChunkConfig | None = None,
        ns_config: NSConfig | None = None,
    ) -> None:
        self.ns_config = ns_config  # None: chosen per batch shape
        params = list(params)
        if params and not isinstance(params[0], dict):
            params = [
                {"params": [p for p in params if p.dim() >= 2], "use_muon": True},
                {"params": [p for p in params if p.dim() < 2], "use_muon": False},
            ]
            params = [g for g in params if g["params"]]
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": ns_coefficients,
            "ns_eps": ns_eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "betas": betas,
            "eps": eps,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "decoupled_weight_decay": True,
        }
        super().__init__(params, defaults, nonfinite, chunks)

    def _check_group(self, gi: int, group: dict[str, Any]) -> None:
        if "use_muon" not in group:
            raise ValueError(
                f"{self.op}: param_groups[{gi}] must say use_muon=True or False "
                "(muon_param_groups(model) makes the usual split)"
            )
        if group["use_muon"]:
            check_muon_group(self.op, gi, group, self.ns_eps_key)
        else:
            check_adam_group(self.op, gi, group)

    def _plan_key(self, group: dict[str, Any]) -> tuple:
        if group["use_muon"]:
            return (True, group["ns_steps"], group["adjust_lr_fn"])
        return (False, group["amsgrad"])

    def _make_plans(
        self, group: dict[str, Any], entries: list[tuple[int, torch.Tensor]]
    ) -> list[MuonPlan | AdamPlan]:
        split = device_groups(entries).values()
        if group["use_muon"]:
            return [MuonPlan(self, group, e) for e in split]
        return [AdamPlan(self, group, e, master_weights=False) for e in split]
