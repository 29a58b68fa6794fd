"""The fusion planner: analyze a module's FX graph, cost each group, build its fused form,
optionally measure both, explain, and apply the accepted fusions.

    plan = tritonkit.fusion.plan(module, example_inputs)
    plan.measure()                  # time every group unfused and fused (both always)
    print(plan.explain())           # group, decision, predicted and measured saving
    fast = plan.apply()             # a GraphModule running the accepted fusions

Generated kernels have no backward: ``apply`` is for inference (no_grad); the tritonkit
operators a known pattern maps to (swiglu, add_layer_norm, linear, attention) have theirs.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

import tritonkit
from tritonkit.fusion import codegen
from tritonkit.fusion.analyzer import FusionAnalyzer, FusionGroup
from tritonkit.fusion.cost import CostParams, Estimate, FusionCostModel

_ACT_NAMES = {"relu": "relu", "silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh"}


@dataclass
class Entry:
    group: FusionGroup
    estimate: Estimate
    fuse: bool
    reason: str
    fused: Callable | None = None  # the fused form, called with the group's external inputs
    inputs: list[fx.Node] | None = None
    unfused_us: float | None = None
    fused_us: float | None = None

    @property
    def measured_saving_us(self) -> float | None:
        if self.unfused_us is None or self.fused_us is None:
            return None
        return self.unfused_us - self.fused_us


def _op_of(an: FusionAnalyzer, node: fx.Node) -> str:
    op = an.infos[node].op
    if op == "gelu":
        approx = node.kwargs.get("approximate", "none")
        if node.op == "call_module":
            approx = an.gm.get_submodule(node.target).approximate
        return "gelu_tanh" if approx == "tanh" else "gelu"
    if op == "pow":
        if len(node.args) == 2 and node.args[1] == 2:
            return "square"
        raise ValueError("pow with an exponent other than 2")
    return op


class FusionPlan:
    """Groups of one traced module, each with its cost estimate, decision and fused form."""

    def __init__(self, gm: fx.GraphModule, example_inputs: tuple, model: FusionCostModel) -> None:
        self.gm = gm
        self.example_inputs = example_inputs
        self.model = model
        self.analyzer = FusionAnalyzer(gm)
        self.values = self._values()
        self.entries: list[Entry] = []
        for g in self.analyzer.groups():
            est = model.estimate(self.analyzer, g)
            fused, inputs, why = self._build(g)
            if len(g.nodes) == 1 and g.kind == "elementwise":
                fuse, reason = False, "a single kernel already: nothing to fuse"
            elif fused is None:
                fuse, reason = False, why
            else:
                fuse, reason = model.decide(est)
            self.entries.append(Entry(g, est, fuse, reason, fused, inputs))

    def _values(self) -> dict[fx.Node, object]:
        env: dict[fx.Node, object] = {}

        class Capture(fx.Interpreter):
            def run_node(self, n):
                env[n] = out = super().run_node(n)
                return out

        with torch.no_grad():
            Capture(self.gm).run(*self.example_inputs)
        return env

    # -- fused forms -----------------------------------------------------------------------

    def _build(self, g: FusionGroup) -> tuple[Callable | None, list[fx.Node] | None, str]:
        try:
            if g.kind == "attention":
                return self._attention(g)
            if g.kind == "epilogue":
                return self._epilogue(g)
            if g.kind == "prologue":
                return self._prologue(g)
            if g.pattern in ("tritonkit.swiglu", "tritonkit.geglu"):
                return self._glu(g)
            return self._generated(g)
        except ValueError as exc:
            return None, None, f"not fusable: {exc}"

    def _generated(self, g: FusionGroup):
        an = self.analyzer
        if len(an.escaping(g)) != 1 or an.escaping(g)[0] is not g.output:
            raise ValueError("an intermediate value is read outside the group")
        ext = an.external_inputs(g)
        out_shape = an.infos[g.output].shape
        kinds = []
        for i in ext:
            shape, dtype = an.infos[i].shape, an.infos[i].dtype
            numel = 1
            for d in shape:
                numel *= d
            if shape == out_shape:
                kinds.append(("full", dtype))
            elif numel == 1:
                kinds.append(("scalar", dtype))
            elif out_shape and numel == out_shape[-1] and shape[-1] == out_shape[-1]:
                kinds.append(("row", dtype))
            else:
                raise ValueError(f"input {i.name} of shape {shape} broadcasts to {out_shape}")
        if not any(k == "full" for k, _ in kinds):
            raise ValueError("no input has the output's shape")
        index = {n: f"v{j}" for j, n in enumerate(g.nodes)}
        index.update({n: f"a{k}" for k, n in enumerate(ext)})
        steps = []
        for n in g.nodes:
            op = _op_of(an, n)
            if n.kwargs and set(n.kwargs) - {"approximate"}:
                raise ValueError(f"{n.name} has keyword arguments {sorted(n.kwargs)}")
            args = list(n.args[:1]) if op in ("square", "gelu", "gelu_tanh") else list(n.args)
            operands = []
            for a in args:
                if isinstance(a, fx.Node):
                    operands.append(index[a])
                elif isinstance(a, (int, float)) and not isinstance(a, bool):
                    operands.append(float(a))
                else:
                    raise ValueError(f"{n.name} has an argument {a!r}")
            steps.append((op, operands))
        fn = codegen.generate(steps, kinds, an.infos[g.output].dtype)
        return fn, ext, ""

    def _glu(self, g: FusionGroup):
        an = self.analyzer
        act, mul = g.nodes
        gate = act.args[0]
        up = next(a for a in mul.args if isinstance(a, fx.Node) and a is not act)
        if _op_of(an, act) == "silu":
            return (lambda gt, u: tritonkit.swiglu(gt, u)), [gate, up], ""
        approx = "tanh" if _op_of(an, act) == "gelu_tanh" else "none"
        return (lambda gt, u: tritonkit.geglu(gt, u, approx)), [gate, up], ""

    def _epilogue(self, g: FusionGroup):
        an = self.analyzer
        if g.pattern != "tritonkit.linear":
            raise ValueError(g.note or "no tritonkit GEMM epilogue for this chain")
        a = g.anchor
        if a.op != "call_module":
            raise ValueError("the GEMM is not an nn.Linear module")
        lin = an.gm.get_submodule(a.target)
        x = a.args[0]
        bias, act, residual = lin.bias, None, None
        for n in g.nodes:
            op = _op_of(an, n)
            other = [i for i in n.all_input_nodes if i not in g.nodes and i is not a]
            if op == "add" and other and len(an.infos[other[0]].shape) == 1 and act is None:
                if bias is not None:
                    raise ValueError("a second bias after the Linear's own")
                bias = self.values[other[0]]
            elif op in _ACT_NAMES:
                act = _ACT_NAMES[op]
            elif op == "add" and other:
                residual = other[0]
        inputs = [x] + ([residual] if residual is not None else [])
        w = lin.weight

        def fused(xv, rv=None):
            return tritonkit.linear(xv, w, bias, act, rv)

        return fused, inputs, ""

    def _prologue(self, g: FusionGroup):
        an = self.analyzer
        (add,) = g.nodes
        x, r = add.args[0], add.args[1]
        if not (isinstance(x, fx.Node) and isinstance(r, fx.Node)):
            raise ValueError("the residual add has a constant operand")
        norm = g.anchor
        mod = an.gm.get_submodule(norm.target) if norm.op == "call_module" else None
        if mod is None:
            raise ValueError("the norm is a function call; only nn.LayerNorm/nn.RMSNorm map")
        if isinstance(mod, nn.RMSNorm):
            return (lambda a, b: tritonkit.add_rms_norm(a, b, mod.weight, mod.eps)), [x, r], ""
        return (
            (lambda a, b: tritonkit.add_layer_norm(a, b, mod.weight, mod.bias, mod.eps)),
            [x, r],
            "",
        )

    def _attention(self, g: FusionGroup):
        an = self.analyzer
        qk, *mid, pv = g.nodes
        q, kt = qk.args[0], qk.args[1]
        v = pv.args[1]
        scale = 1.0
        for n in mid:
            op = an.infos[n].op
            if an.infos[n].kind == "softmax":
                continue
            const = next((a for a in n.args if isinstance(a, (int, float))), None)
            if op == "mul" and const is not None:
                scale *= float(const)
            elif op == "div" and const is not None:
                scale /= float(const)
            else:
                raise ValueError(f"{n.name} between the scores and the softmax is not a scale")

        def fused(qv, ktv, vv):
            return tritonkit.attention(qv, ktv.transpose(-2, -1), vv, scale=scale)

        return fused, [q, kt, v], ""

    # -- measurement, explanation, application ---------------------------------------------

    def _unfused_callable(self, e: Entry) -> tuple[Callable, list]:
        g = e.group
        nodes = list(g.nodes)
        if g.kind == "epilogue":
            nodes = [g.anchor, *nodes]
        if g.kind == "prologue":
            nodes = [*nodes, g.anchor]
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        inside = set(nodes)
        ext = list(dict.fromkeys(i for n in nodes for i in n.all_input_nodes if i not in inside))
        for i in ext:
            env[i] = graph.placeholder(i.name)
        for n in nodes:
            env[n] = graph.node_copy(n, lambda a: env[a])
        graph.output(env[nodes[-1]])
        sub = fx.GraphModule(self.gm, graph)
        return sub, [self.values[i] for i in ext]

    def measure(self, rep_ms: int = 100) -> FusionPlan:
        """Time each group as PyTorch runs it and fused (declined ones too), in microseconds."""
        for e in self.entries:
            if e.fused is None:
                continue
            unfused, uargs = self._unfused_callable(e)
            fargs = [self.values[i] for i in e.inputs]
            with torch.no_grad():
                e.unfused_us = _time_us(lambda f=unfused, a=uargs: f(*a), uargs, rep_ms)
                e.fused_us = _time_us(lambda f=e.fused, a=fargs: f(*a), uargs, rep_ms)
        return self

    def explain(self) -> str:
        """One line per group: kind, ops, pattern, decision and why, predicted and measured
        saving (microseconds), bytes and launches unfused -> fused."""
        an = self.analyzer
        lines = [f"fusion plan ({self.model.params.source}): {len(self.entries)} groups"]
        for e in self.entries:
            g, est = e.group, e.estimate
            ops = "+".join(_safe_op(an, n) for n in g.nodes)
            anchor = (
                f" on {g.anchor.name}" if g.anchor is not None and g.kind != "attention" else ""
            )
            measured = "-" if e.measured_saving_us is None else f"{e.measured_saving_us:.2f}"
            lines.append(
                f"[{g.index}] {g.kind}{anchor}: {ops} -> {g.pattern or '-'}: "
                f"{'FUSE' if e.fuse else 'keep'} ({e.reason}); predicted {est.saving_us:.2f} us, "
                f"measured {measured} us; bytes {est.unfused_bytes} -> {est.fused_bytes}, "
                f"launches {est.unfused_launches} -> {est.fused_launches}"
            )
        return "\n".join(lines)

    def apply(self) -> fx.GraphModule:
        """A copy of the module's graph with every accepted group replaced by its fused form."""
        gm = fx.GraphModule(self.gm, self.gm.graph.__deepcopy__())
        old_to_new = dict(zip(self.gm.graph.nodes, gm.graph.nodes))
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        for e in self.entries:
            if not e.fuse:
                continue
            g = e.group
            last = g.anchor if g.kind == "prologue" else g.output
            with gm.graph.inserting_after(old_to_new[last]):
                new = gm.graph.call_function(e.fused, tuple(old_to_new[i] for i in e.inputs))
            if g.kind == "prologue":
                with gm.graph.inserting_after(new):
                    out = gm.graph.call_function(operator.getitem, (new, 0))
                with gm.graph.inserting_after(out):
                    total = gm.graph.call_function(operator.getitem, (new, 1))
                old_to_new[g.anchor].replace_all_uses_with(out)
                old_to_new[g.output].replace_all_uses_with(total)
                dead = [old_to_new[g.anchor], old_to_new[g.output]]
                old_to_new[g.anchor], old_to_new[g.output] = out, total
            else:
                old_to_new[g.output].replace_all_uses_with(new)
                nodes = list(g.nodes) + ([g.anchor] if g.kind == "epilogue" else [])
                dead = [old_to_new[n] for n in nodes]
                old_to_new[g.output] = new  # later groups read the fused value
            for node in sorted(dead, key=lambda n: -order[n]):
                if not node.users:
                    gm.graph.erase_node(node)
        gm.graph.lint()
        gm.recompile()
        return gm


def _safe_op(an: FusionAnalyzer, n: fx.Node) -> str:
    try:
        return _op_of(an, n) or an.infos[n].kind
    except ValueError:
        return an.infos[n].op


def _time_us(fn: Callable, args: list, rep_ms: int) -> float:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if tensors and tensors[0].is_cuda:
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=rep_ms) * 1e3
    fn()  # compile (interpreter)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def plan(
    module: nn.Module,
    example_inputs: tuple,
    params: CostParams | None = None,
) -> FusionPlan:
    """Trace ``module`` (``torch.fx.symbolic_trace``), propagate shapes with
    ``example_inputs`` and plan its fusions.

    Args:
        module: an ``nn.Module`` that ``torch.fx.symbolic_trace`` can trace.
        example_inputs: a tuple of inputs (their shapes and dtypes are planned for).
        params: the cost model's rates (``CostParams.from_profile()`` when None;
            ``CostParams.calibrate()`` measures them).

    Returns:
        A :class:`FusionPlan`.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"tritonkit.fusion.plan: module must be an nn.Module, got {type(module).__name__}"
        )
    if not isinstance(example_inputs, tuple):
        kind = type(example_inputs).__name__
        raise TypeError(f"tritonkit.fusion.plan: example_inputs must be a tuple, got {kind}")
    gm = module if isinstance(module, fx.GraphModule) else fx.symbolic_trace(module)
    with torch.no_grad():
        ShapeProp(gm).propagate(*example_inputs)
    return FusionPlan(gm, example_inputs, FusionCostModel(params))
