"""What tritonkit's optimizers share: parameter checks, the non-finite gradient policy, the
GradScaler protocol, gradient tables and the state_dict layout of ``torch.optim``."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Protocol

import torch
from torch.optim import Optimizer

from tritonkit.ops._core.device import interpreter_enabled
from tritonkit.ops._core.launch import pipelined
from tritonkit.ops._core.layout import LAYOUT_COPIES, is_dense
from tritonkit.ops.optim.config import ChunkConfig, default_chunks
from tritonkit.ops.optim.plan import TensorTable, launch_nonfinite_check, launch_sum_squares, upload

NONFINITE = ("skip", "raise", "propagate")  # the default first
PARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class NonFiniteGradError(FloatingPointError):
    """A gradient held NaN or an infinity; the step was not taken (nothing was written)."""


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_hyper(op: str, name: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"{op}: {name} must be {expected}, got {value!r}")


def check_lr(op: str, lr: Any) -> None:
    if isinstance(lr, torch.Tensor):
        check_hyper(op, "lr", lr, lr.numel() == 1, "a float or a 1-element tensor")
        if lr.device.type != "meta":
            lr = float(lr.detach().reshape(()).cpu())
        else:
            return
    check_hyper(op, "lr", lr, isinstance(lr, (int, float)) and lr >= 0, "a number >= 0")


def check_params(op: str, gi: int, params: Sequence[Any]) -> None:
    """Every parameter is a dense floating-point tensor of a dtype and device the kernels take
    (a TypeError naming it otherwise)."""
    for i, p in enumerate(params):
        where = f"param_groups[{gi}]['params'][{i}] (shape {tuple(p.shape)})"
        if p.layout != torch.strided:
            raise TypeError(f"{op}: {where} must be a strided tensor, got layout {p.layout}")
        if p.dtype not in PARAM_DTYPES:
            raise TypeError(
                f"{op}: {where} must have dtype float32, float16 or bfloat16, got {_name(p.dtype)}"
            )
        on_cpu_ok = p.device.type == "cpu" and interpreter_enabled()
        if p.device.type != "cuda" and not on_cpu_ok:
            hint = (
                " (CPU tensors run only under the Triton interpreter: TRITON_INTERPRET=1)"
                if p.device.type == "cpu"
                else ""
            )
            raise TypeError(f"{op}: {where} must be on a CUDA device, got {p.device}{hint}")
        if not is_dense(p):
            raise ValueError(
                f"{op}: {where} must be dense (contiguous or a permutation of a contiguous "
                f"tensor), got strides {p.stride()}"
            )


class GradRow:
    """The gradient row of a tensor table: re-pointed only when a gradient was reallocated.

    Gradients are checked (dtype, shape, layout) only when their addresses change, which
    ``zero_grad(set_to_none=False)`` or PyTorch's caching allocator often avoid. A gradient
    whose strides differ from its parameter's (possible only when assigned by hand) is copied
    into the parameter's layout for the step, and counted in ``LAYOUT_COPIES``.
    """

    __slots__ = ("copies", "index", "op", "params", "ptrs", "row", "table")

    def __init__(
        self, op: str, table: TensorTable, row: int, params: Sequence[torch.Tensor]
    ) -> None:
        self.op, self.table, self.row, self.params = op, table, row, list(params)
        self.ptrs: tuple[int, ...] | None = None
        self.copies: list[torch.Tensor] = []

    def refresh(self) -> None:
        grads = [p.grad for p in self.params]
        try:
            ptrs = tuple([g.data_ptr() for g in grads])
        except RuntimeError:  # a gradient without strided storage (sparse): checked below
            ptrs = None
        if ptrs == self.ptrs and ptrs is not None and not self.copies:
            return
        used = []
        self.copies = []
        for p, g in zip(self.params, grads):
            if g.layout != torch.strided:
                raise TypeError(
                    f"{self.op}: the gradient of a parameter of shape {tuple(p.shape)} must be "
                    f"a strided (dense) tensor, got layout {g.layout} (sparse gradients are "
                    "not supported)"
                )
            if g.dtype != p.dtype or g.shape != p.shape or g.device != p.device:
                raise TypeError(
                    f"{self.op}: the gradient of a parameter of shape {tuple(p.shape)}, "
                    f"{_name(p.dtype)} on {p.device} must match it, got shape "
                    f"{tuple(g.shape)}, {_name(g.dtype)} on {g.device}"
                )
            if g.stride() != p.stride() and p.numel() > 1:
                g = torch.empty_like(p).copy_(g)
                LAYOUT_COPIES.count += 1
                self.copies.append(g)
            used.append(g.data_ptr())
        self.ptrs = ptrs
        self.table.set_row_ptrs(self.row, tuple(used))


class NonFiniteGuard:
    """The non-finite policy of one optimizer: one device flag for the whole step.

    ``skip`` (the default): a check pass over every gradient (fused into ``clip_grad_norm_``'s
    norm pass when the step is clipped), no sync; every kernel of the step reads the flag and
    returns at once when it is set, so the step is skipped on the device (params, states and
    step counts unchanged), as ``torch.amp.GradScaler`` skips one; ``found`` then holds 1
    and ``count`` (the steps skipped so far) has grown by one.
    ``raise``: the same pass, then one host sync; a NaN or an infinity raises
    ``NonFiniteGradError`` naming the parameters before anything is written.
    ``propagate``: no check; NaN and infinities flow into the parameters as in ``torch.optim``.
    Under a ``GradScaler`` (its ``found_inf``), its flag is used and no pass runs.
    """

    def __init__(self, mode: str, device: torch.device) -> None:
        self.mode = mode
        self.found = torch.zeros(1, dtype=torch.int32, device=device)  # the last check's
        self.count = torch.zeros(1, dtype=torch.int32, device=device)  # steps that met one
        self.checked: list[Plan] | None = None  # plans a clip checked for the coming step

    def buffers(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(found, count) on ``device`` (moved there if the parameters moved)."""
        if self.found.device != device:
            self.found, self.count = self.found.to(device), self.count.to(device)
        return self.found, self.count

    def start(self, plans: Sequence[Plan]) -> tuple[Any, ...] | None:
        """Before a pass that checks ``plans``' gradients: the flag zeroed, and what each
        check launch takes ((flags or None, found, count) per plan); None with
        ``propagate``."""
        if self.mode == "propagate" or not plans:
            return None
        found, count = self.buffers(plans[0].table.device)
        found.zero_()
        if self.mode != "raise":
            return tuple((None, found, count) for _ in plans)
        for plan in plans:  # the names of a check that found one but was never stepped
            plan.flags.zero_()
        return tuple((plan.flags, found, count) for plan in plans)

    def flag(
        self,
        plans: Sequence[Plan],
        scaler_found_inf: torch.Tensor | None,
        names: Callable[[int, int], str],
    ) -> torch.Tensor | None:
        """The flag the step kernels must read (None: none), after the check if one runs
        (none if ``clip_grad_norm_`` checked these plans' gradients already)."""
        checked, self.checked = self.checked, None
        if scaler_found_inf is not None:
            return scaler_found_inf
        if self.mode == "propagate":
            return None
        fused = checked is not None and len(checked) == len(plans)
        if not (fused and all(a is b for a, b in zip(checked, plans))):
            args = self.start(plans)
            for plan, (flags, found, count) in zip(plans, args):
                launch_nonfinite_check(
                    plan.table, plan.grad_row, plan.p_dtype, flags, found, count, plan.chunks
                )
        if self.mode == "raise" and self.found.item() != 0:  # the opt-in host sync
            bad = []
            for k, plan in enumerate(plans):
                bad += [names(k, int(i)) for i in plan.flags.nonzero().flatten().tolist()]
                plan.flags.zero_()
            raise NonFiniteGradError(
                f"non-finite gradient (NaN or inf) in {', '.join(bad)}: the step was not "
                "taken and no parameter or state was changed"
            )
        return self.found


def scaler_inputs(opt: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(found_inf, grad_scale) set by ``torch.amp.GradScaler.step`` on an optimizer that
    declares ``_step_supports_amp_scaling``, or None each."""
    return getattr(opt, "found_inf", None), getattr(opt, "grad_scale", None)


def device_groups(
    params: Iterable[tuple[int, torch.Tensor]],
) -> dict[tuple[torch.device, torch.dtype], list[tuple[int, torch.Tensor]]]:
    """(index, parameter) pairs grouped by (device, dtype), in order."""
    out: dict[tuple[torch.device, torch.dtype], list[tuple[int, torch.Tensor]]] = {}
    for i, p in params:
        out.setdefault((p.device, p.dtype), []).append((i, p))
    return out


def state_like(
    p: torch.Tensor, t: torch.Tensor | None, dtype: torch.dtype, fill: float = 0.0
) -> torch.Tensor:
    """``t`` as a state tensor of ``p`` (p's device and strides, ``dtype``), copied only if it
    is not one already; zeros (or ``fill``) where ``t`` is None."""
    if t is None:
        return torch.full_like(p, fill, dtype=dtype, memory_format=torch.preserve_format)
    if t.device == p.device and t.dtype == dtype and t.stride() == p.stride():
        return t
    out = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
    return out.copy_(t)


def step_values(states: Sequence[dict[str, Any]], table: TensorTable) -> torch.Tensor:
    """Each tensor's step count repeated once per program of ``table`` (float32 on its
    device), with no host sync: counts on the host (new states, states loaded from a
    ``state_dict``) are uploaded, counts already on the device copied there."""
    device = table.device
    host = torch.zeros(len(states), dtype=torch.float32)
    on_device = []
    for i, st in enumerate(states):
        step = st.get("step")
        if isinstance(step, torch.Tensor) and step.device == device:
            on_device.append(i)
        elif step is not None:
            host[i] = float(step)  # a number, or a tensor on the host
    per_tensor = upload(host, device)
    if on_device:
        counts = [states[i]["step"].detach().reshape(()).float() for i in on_device]
        index = upload(torch.tensor(on_device, dtype=torch.int64), device)
        per_tensor.index_copy_(0, index, torch.stack(counts))
    return per_tensor.index_select(0, table.chunk_tensor.long())


class Plan(Protocol):
    """The tensors of one param group of one (device, dtype), laid out for its launches."""

    table: TensorTable  # its gradient row is ``grad_row``
    grad_row: int
    p_dtype: torch.dtype
    params: list[torch.Tensor]
    index: list[int]  # each parameter's position in its group
    flags: torch.Tensor  # float32 per tensor: the non-finite check's (named by "raise")
    grads: GradRow
    chunks: ChunkConfig  # how its multi-tensor launches cut the tensors

    def launch(
        self,
        opt: Any,
        group: dict[str, Any],
        flag: torch.Tensor | None,
        grad_scale: torch.Tensor | None,
    ) -> None: ...


class FusedOptimizer(Optimizer):
    """A ``torch.optim.Optimizer`` whose step is a few multi-tensor launches per param group.

    A subclass says how to check a group (``_check_group``), what in a group changes the
    layout of its launches (``_plan_key``) and how to lay out a group's parameters that have
    gradients (``_make_plans``). Plans are cached per group and rebuilt only when the set of
    parameters with gradients, the layout key or the state (``load_state_dict``,
    ``add_param_group``) changes; a step otherwise costs a few dictionary reads per group,
    one pass over the gradients' addresses and the launches.
    """

    op = "tritonkit.optim"
    _group_defaults: ClassVar[dict[str, Any]] = {}  # keys a loaded torch group may lack

    def __init__(
        self,
        params: Any,
        defaults: dict[str, Any],
        nonfinite: str,
        chunks: ChunkConfig | None = None,
    ) -> None:
        if nonfinite not in NONFINITE:
            raise ValueError(
                f"{self.op}: nonfinite must be one of {list(NONFINITE)}, got {nonfinite!r}"
            )
        if chunks is not None and not isinstance(chunks, ChunkConfig):
            raise TypeError(f"{self.op}: chunks must be a ChunkConfig or None, got {chunks!r}")
        self.chunks = chunks  # None: each (device, dtype) takes default_chunks
        self._plans: dict[int, tuple[tuple, list[Plan]]] = {}
        self._version = 0
        self._seed = random.Random(torch.initial_seed()).getrandbits(31)
        self._clip: torch.Tensor | None = None  # the pending clip's divisor (clip_grad_norm_)
        super().__init__(params, defaults)
        first = next((p for g in self.param_groups for p in g["params"]), None)
        device = first.device if first is not None else torch.device("cpu")
        self.guard = NonFiniteGuard(nonfinite, device)
        self._step_supports_amp_scaling = True  # GradScaler passes found_inf and grad_scale

    def chunks_for(self, device: torch.device, dtype: torch.dtype) -> ChunkConfig:
        """The multi-tensor launch config of the parameters of one (device, dtype)."""
        return self.chunks if self.chunks is not None else default_chunks(device, dtype)

    def _check_group(self, gi: int, group: dict[str, Any]) -> None:
        raise NotImplementedError

    def _plan_key(self, group: dict[str, Any]) -> tuple:
        return ()

    def _make_plans(
        self, group: dict[str, Any], entries: list[tuple[int, torch.Tensor]]
    ) -> list[Plan]:
        raise NotImplementedError

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._check_group(len(self.param_groups) - 1, self.param_groups[-1])
        self._version += 1

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in self._group_defaults.items():
                group.setdefault(key, value)

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim``'s layout: ``step`` as a standalone float32 tensor (on the CPU, or on
        the parameter's device for capturable groups), as ``torch.optim.Adam`` stores it."""
        sd = super().state_dict()
        capturable = {}
        for g in sd["param_groups"]:
            for i in g["params"]:
                capturable[i] = g.get("capturable", False)
        state = {}
        for i, st in sd["state"].items():
            st = dict(st)
            step = st.get("step")
            if isinstance(step, torch.Tensor):
                device = step.device if capturable.get(i) else "cpu"
                st["step"] = step.detach().to(device, torch.float32, copy=True)
            state[i] = st
        sd["state"] = state
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state saved by this class or by the matching ``torch.optim`` class."""
        super().load_state_dict(state_dict)
        self._after_load(state_dict)
        self._plans.clear()
        self._version += 1

    def _after_load(self, state_dict: dict[str, Any]) -> None:
        pass

    def _group_plans(self, gi: int, group: dict[str, Any]) -> list[Plan]:
        params = group["params"]
        with_grad = tuple([p.grad is not None for p in params])
        key = (id(params), len(params), with_grad, self._plan_key(group), self._version)
        cached = self._plans.get(gi)
        if cached is None or cached[0] != key:
            entries = [(i, p) for i, (p, has) in enumerate(zip(params, with_grad)) if has]
            plans = self._make_plans(group, entries) if entries else []
            cached = self._plans[gi] = (key, plans)
        for plan in cached[1]:
            plan.grads.refresh()
        return cached[1]

    @torch.no_grad()
    def clip_grad_norm_(
        self,
        max_norm: float | torch.Tensor,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
    ) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over this optimizer's parameters with gradients,
        fused into the next :meth:`step`.

        The global norm takes one read of the gradients (float32 partial sums per block, no
        host sync) and is returned now; the clip coefficient ``min(1, max_norm / (norm +
        1e-6))`` is applied inside the next step's update, which divides each gradient by
        its inverse as it reads it and writes the clipped gradient back: after the step the
        gradients hold what ``clip_grad_norm_`` leaves, and the update is the one computed
        from them. Between this call and the step the gradients are still unclipped; a
        gradient changed in between is clipped by the coefficient computed here. The same
        read is the step's non-finite check (``nonfinite`` "skip" or "raise"), which the step
        then does not repeat: a clipped step reads its gradients twice in all (the norm, the
        update), and a gradient changed in between is not checked again.

        Args:
            max_norm: the largest global norm kept (a float or a 1-element tensor).
            norm_type: 2.0 (the Euclidean norm; other norms are not supported).
            error_if_nonfinite: raise when the norm is NaN or infinite (one host sync), as
                ``clip_grad_norm_`` does; the pending clip is then dropped.

        Returns:
            The total norm of the unclipped gradients, a float32 0-d tensor on their device
            (float32 also for 16-bit gradients, whose norm ``clip_grad_norm_`` returns in
            their dtype).

        Raises:
            ValueError: norm_type is not 2; max_norm is negative.
            RuntimeError: with ``error_if_nonfinite``, a NaN or infinite norm.
        """
        op = f"{self.op}.clip_grad_norm_"
        if float(norm_type) != 2.0:
            raise ValueError(
                f"{op}: norm_type must be 2.0 (the fused clip's norm), got {norm_type}"
            )
        if not isinstance(max_norm, torch.Tensor) and not max_norm >= 0:
            raise ValueError(f"{op}: max_norm must be a number >= 0, got {max_norm!r}")
        plans = [
            plan
            for gi, group in enumerate(self.param_groups)
            for plan in self._group_plans(gi, group)
        ]
        self.guard.checked = None
        if not plans:
            self._clip = None
            return torch.tensor(0.0)
        device = plans[0].table.device
        checks = self.guard.start(plans) or (None,) * len(plans)
        sums = []
        for plan, check in zip(plans, checks):
            partials = torch.empty(
                plan.table.n_chunks, dtype=torch.float32, device=plan.table.device
            )
            launch_sum_squares(
                plan.table, plan.grad_row, plan.p_dtype, partials, plan.chunks, check
            )
            sums.append(partials.sum().to(device))
        total = torch.stack(sums).sum().sqrt() if len(sums) > 1 else sums[0].sqrt()
        if error_if_nonfinite and not torch.isfinite(total).item():  # the opt-in host sync
            self._clip = None
            raise RuntimeError(
                f"{op}: the total norm of order 2.0 for gradients is non-finite, so it cannot "
                "be clipped. To disable this error and scale the gradients by the non-finite "
                "norm anyway, set `error_if_nonfinite=False`"
            )
        self.guard.checked = plans if checks[0] is not None else None
        if isinstance(max_norm, torch.Tensor):  # a host tensor stays there: a scalar operand
            max_norm = max_norm.detach().reshape(()).float()
        # max_norm / (norm + 1e-6) as torch's clip_grad_norm_ writes it (the same rounding);
        # a number stays a kernel argument, never copied to the device (a blocking copy).
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        self._clip = torch.reciprocal(coef).reshape(1)  # the step divides by it
        return total

    def _grad_divisor(self, grad_scale: torch.Tensor | None) -> torch.Tensor | None:
        """What the step kernels divide the gradients by: GradScaler's scale, a pending
        clip's inverse coefficient, or both (then consumed)."""
        clip, self._clip = self._clip, None
        if clip is None:
            return grad_scale
        if grad_scale is None:
            return clip
        return (grad_scale.float() * clip.to(grad_scale.device)).reshape(1)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimization step over every parameter that has a gradient.

        Args:
            closure: optional; reevaluates the model (with autograd) and returns the loss.

        Returns:
            The closure's loss, or None.

        No host sync, except with ``nonfinite="raise"`` (which must read the flag to raise):
        the check, the skip and the count of skipped steps happen on the device.

        Raises:
            NonFiniteGradError: with ``nonfinite="raise"``, when a gradient holds NaN or an
                infinity; nothing was written.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [
            (gi, group, plan)
            for gi, group in enumerate(self.param_groups)
            for plan in self._group_plans(gi, group)
        ]
        if not work:
            self._clip = None
            return loss
        found_inf, grad_scale = scaler_inputs(self)
        grad_scale = self._grad_divisor(grad_scale)

        def name(k: int, i: int) -> str:
            gi, _, plan = work[k]
            shape = tuple(plan.params[i].shape)
            return f"param_groups[{gi}]['params'][{plan.index[i]}] (shape {shape})"

        with pipelined():  # a first step's kernels compile in parallel (launch.pipelined)
            flag = self.guard.flag([plan for _, _, plan in work], found_inf, name)
            self._seed = (self._seed * 1103515245 + 12345) % 2**31  # one random stream per step
            for _, group, plan in work:
                plan.launch(self, group, flag, grad_scale)
                # The kernels write through pointers autograd does not see: bump the version
                # counters as an in-place ATen op would, so that a graph that saved a parameter
                # raises as it does under torch.optim, and a cache keyed on the version (the fp8
                # weight codes of Float8Linear) sees the change.
                torch.autograd.graph.increment_version(plan.params)
        return loss

    @property
    def found_inf_flag(self) -> torch.Tensor | None:
        """The device flag of the last checked step (int32, 1 element): 1 if it met a
        non-finite gradient (and was skipped), else 0; None with ``"propagate"``. Reading its
        value (``.item()``) waits for the step."""
        return None if self.guard.mode == "propagate" else self.guard.found

    @property
    def nonfinite_steps(self) -> torch.Tensor:
        """How many steps met a non-finite gradient since this optimizer was made (skipped
        with ``"skip"``, refused with ``"raise"``; never counted with ``"propagate"`` or under
        a ``GradScaler``, which counts its own): an int32 0-d tensor on the parameters'
        device, counted there. Reading its value (``.item()``) waits for the step."""
        return self.guard.count.view(())
