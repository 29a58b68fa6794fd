"""``tritonkit.optim.Adam`` and ``AdamW``: ``torch.optim``'s, in one launch per dtype and group."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tritonkit.ops.optim.config import ChunkConfig
from tritonkit.ops.optim.kernels_adam import (
    N_ROWS,
    ROW_G,
    ROW_M,
    ROW_M_OUT,
    ROW_MASTER,
    ROW_P,
    ROW_P_OUT,
    ROW_V,
    ROW_V_OUT,
    ROW_VMAX,
    ROW_VMAX_OUT,
)
from tritonkit.ops.optim.plan import AdamHyper, TensorTable, launch_adam
from tritonkit.optim._base import (
    FusedOptimizer,
    GradRow,
    check_hyper,
    check_lr,
    check_params,
    device_groups,
    state_like,
    step_values,
)

_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master_param")


class AdamPlan:
    """The tensors of one param group of one (device, dtype), laid out for one Adam launch."""

    __slots__ = (
        "chunks",
        "flags",
        "grads",
        "index",
        "p_dtype",
        "params",
        "s_dtype",
        "steps",
        "stochastic",
        "table",
    )
    grad_row = ROW_G

    def __init__(
        self,
        opt: FusedOptimizer,
        group: dict[str, Any],
        entries: list[tuple[int, torch.Tensor]],
        master_weights: bool = False,
        stochastic_rounding: bool = False,
    ) -> None:
        self.index = [i for i, _ in entries]
        self.params = params = [p for _, p in entries]
        p0 = params[0]
        self.p_dtype = p0.dtype
        self.stochastic = stochastic_rounding and p0.dtype != torch.float32
        master = master_weights and p0.dtype != torch.float32
        self.s_dtype = torch.float32 if master else p0.dtype
        states = [opt.state[p] for p in params]
        for p, st in zip(params, states):
            st["exp_avg"] = state_like(p, st.get("exp_avg"), self.s_dtype)
            st["exp_avg_sq"] = state_like(p, st.get("exp_avg_sq"), self.s_dtype)
            if group["amsgrad"]:
                st["max_exp_avg_sq"] = state_like(p, st.get("max_exp_avg_sq"), self.s_dtype)
            if master:
                st["master_param"] = state_like(p, st.get("master_param", p), torch.float32)
        self.chunks = opt.chunks_for(p0.device, p0.dtype)
        table = self.table = TensorTable(
            N_ROWS, [p.numel() for p in params], p0.device, self.chunks.block
        )
        table.set_row(ROW_P, params)
        table.set_row(ROW_M, [st["exp_avg"] for st in states])
        table.set_row(ROW_V, [st["exp_avg_sq"] for st in states])
        if group["amsgrad"]:
            table.set_row(ROW_VMAX, [st["max_exp_avg_sq"] for st in states])
        if master:
            table.set_row(ROW_MASTER, [st["master_param"] for st in states])
        for dst, src in (
            (ROW_P_OUT, ROW_P),
            (ROW_M_OUT, ROW_M),
            (ROW_V_OUT, ROW_V),
            (ROW_VMAX_OUT, ROW_VMAX),
        ):
            table.copy_row(dst, src)
        # Step counts: one per program, on the device; state["step"] is a view of the first.
        self.steps = step_values(states, table)
        for st, first in zip(states, table.first):
            st["step"] = self.steps[first]
        self.grads = GradRow(opt.op, table, ROW_G, params)
        self.flags = torch.zeros(len(params), dtype=torch.float32, device=p0.device)

    def launch(
        self,
        opt: FusedOptimizer,
        group: dict[str, Any],
        flag: torch.Tensor | None,
        grad_scale: torch.Tensor | None,
    ) -> None:
        lr = group["lr"]
        if isinstance(lr, torch.Tensor) and lr.device != self.table.device:
            lr = lr.item()
        beta1, beta2 = group["betas"]
        h = AdamHyper(
            lr,
            beta1,
            beta2,
            group["eps"],
            group["weight_decay"],
            group["decoupled_weight_decay"],
            group["amsgrad"],
            group["maximize"],
        )
        launch_adam(
            self.table,
            self.steps,
            self.p_dtype,
            self.s_dtype,
            h,
            master=self.s_dtype != self.p_dtype,
            stochastic=self.stochastic,
            seed=opt._seed,
            flag=flag,
            grad_scale=grad_scale,
            config=self.chunks,
        )


def check_adam_group(op: str, gi: int, group: dict[str, Any]) -> None:
    """Adam's hyperparameters (ValueError naming the one out of range) and parameters."""
    check_lr(op, group["lr"])
    betas = group["betas"]
    check_hyper(op, "betas", betas, len(betas) == 2, "a pair (beta1, beta2)")
    for k, b in enumerate(betas):
        b = float(b)
        check_hyper(op, f"betas[{k}]", b, 0.0 <= b < 1.0, "in [0, 1)")
    group["betas"] = tuple(float(b) for b in betas)
    check_hyper(op, "eps", group["eps"], group["eps"] > 0, "> 0")
    wd = group["weight_decay"]
    check_hyper(op, "weight_decay", wd, wd >= 0, ">= 0")
    differentiable = group.get("differentiable", False)
    check_hyper(op, "differentiable", differentiable, not differentiable, "False (unsupported)")
    check_params(op, gi, group["params"])


class Adam(FusedOptimizer):
    """``torch.optim.Adam`` with every parameter of a dtype updated by one fused launch.

    Same constructor, param groups, ``state_dict`` layout (``step``, ``exp_avg``,
    ``exp_avg_sq``, ``max_exp_avg_sq``: a state saved here loads into ``torch.optim.Adam``
    and the reverse), ``zero_grad``, closures and learning-rate schedulers (``lr`` is read from
    the param group at every step). float32 results agree with ``torch.optim.Adam`` to a few
    units in the last place (the same operations in the same order, in float32; bias
    corrections in float64).

    Args:
        params: parameters or param groups; CUDA tensors of float32, float16 or bfloat16
            (CPU tensors only under the Triton interpreter).
        lr: learning rate, a float or a 1-element tensor (read on the device when it is on the
            parameters' device: CUDA-graph safe).
        betas, eps, weight_decay, amsgrad, maximize: as ``torch.optim.Adam``; here ``eps``
            must be > 0.
        decoupled_weight_decay: AdamW's decay (``AdamW`` sets it).
        capturable: accepted for torch's API; steps always live on the device here and the
            step needs no host sync (except with ``nonfinite="raise"``, refused with it), so
            any step can be captured in a CUDA graph once its tables are built (after one
            eager step).
        foreach, fused: accepted and ignored (the step is always fused).
        differentiable: not supported (ValueError).
        master_weights: keep a float32 copy of 16-bit parameters (``state["master_param"]``)
            and float32 moments; the update is computed on the copy, which is rounded into
            the parameter. The copy is the truth: a parameter changed outside the optimizer
            must be copied into it (``state["master_param"].copy_(p)``).
        stochastic_rounding: round 16-bit parameters (without master weights) up or down at
            random, unbiased, instead of to nearest, so that updates smaller than half a unit
            in the last place still move the parameter on average. Moments stay in the
            parameter's dtype, rounded to nearest.
        nonfinite: what a NaN or an infinity in a gradient does (see ``NonFiniteGuard``).
            ``"skip"`` (default): the step is skipped on the device, nothing written, and
            ``nonfinite_steps`` (a device counter) grows by one; costs a read of the gradients
            (4 bytes per float32 parameter, none when ``clip_grad_norm_`` ran: its norm pass
            checks them) and no host sync. ``"raise"``: ``NonFiniteGradError`` naming the
            parameters, nothing written; the same read and one host sync per step (the host
            waits for the GPU, so it cannot queue the next forward ahead). ``"propagate"``
            (PyTorch's behaviour): no check, nothing extra. Under ``torch.amp.GradScaler`` the
            scaler's own check decides, and the step skips as PyTorch's fused Adam does.
        chunks: the kernels' launch config (elements per program, warps); None: this GPU's
            shipped table row for the parameters' dtype, else ``heuristic_chunks``.
    """

    op = "tritonkit.optim.Adam"
    _group_defaults: ClassVar[dict[str, Any]] = {
        "amsgrad": False,
        "maximize": False,
        "foreach": None,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "decoupled_weight_decay": False,
    }

    def __init__(
        self,
        params: Any,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
        master_weights: bool = False,
        stochastic_rounding: bool = False,
        nonfinite: str = "skip",
        chunks: ChunkConfig | None = None,
    ) -> None:
        op = self.op
        if master_weights and stochastic_rounding:
            raise ValueError(
                f"{op}: master_weights and stochastic_rounding are alternatives, got both True"
            )
        if capturable and nonfinite == "raise":
            raise ValueError(
                f"{op}: capturable=True needs nonfinite='skip' or 'propagate' ('raise' syncs "
                "with the host every step), got nonfinite='raise'"
            )
        self.master_weights = master_weights
        self.stochastic_rounding = stochastic_rounding
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
            "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        super().__init__(params, defaults, nonfinite, chunks)

    def _check_group(self, gi: int, group: dict[str, Any]) -> None:
        check_adam_group(self.op, gi, group)

    def _plan_key(self, group: dict[str, Any]) -> tuple:
        return (group["amsgrad"],)

    def _make_plans(
        self, group: dict[str, Any], entries: list[tuple[int, torch.Tensor]]
    ) -> list[AdamPlan]:
        return [
            AdamPlan(self, group, e, self.master_weights, self.stochastic_rounding)
            for e in device_groups(entries).values()
        ]

    def _after_load(self, state_dict: dict[str, Any]) -> None:
        """PyTorch casts every floating state tensor to its parameter's dtype; float32 states
        kept for 16-bit parameters (``master_weights``) are taken again from ``state_dict``,
        exactly."""
        if not self.master_weights:
            return
        params = [p for g in self.param_groups for p in g["params"]]
        for i, saved in state_dict["state"].items():
            p = params[i]
            if p.dtype == torch.float32:
                continue
            st = self.state[p]
            for key in _STATE_KEYS:
                if isinstance(saved.get(key), torch.Tensor):
                    st[key] = state_like(p, saved[key], torch.float32)


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay (default 1e-2); see ``Adam``
    for the arguments and what differs."""

    op = "tritonkit.optim.AdamW"
    _group_defaults: ClassVar[dict[str, Any]] = {
        **Adam._group_defaults,
        "decoupled_weight_decay": True,
    }

    def __init__(
        self,
        params: Any,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("decoupled_weight_decay", None)
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad, decoupled_weight_decay=True, **kwargs
        )
