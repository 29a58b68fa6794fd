"""FusionAnalyzer: the fusable groups of an FX graph.

A graph (``torch.fx.symbolic_trace`` of a module, shapes from one run on example inputs) is
read node by node:

- elementwise nodes (add, mul, activations, ...) whose output has the shape of the group
  they extend join the group of the producer they read, when that producer has no other
  user (its value then never needs to be stored);
- a group whose first input is a GEMM's output (``nn.Linear``, ``F.linear``, ``matmul``)
  that nothing else reads becomes that GEMM's **epilogue**;
- a group that is one residual add feeding a LayerNorm/RMSNorm becomes that norm's
  **prologue** (tritonkit's ``add_layer_norm`` / ``add_rms_norm``);
- ``softmax(q @ k^T * scale) @ v`` is an **attention** group.

Known shapes of groups are mapped to tritonkit's fused operators (``Pattern``); any other
elementwise chain is a candidate for a generated Triton kernel (``codegen``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

# fx targets -> elementwise op names (the names codegen knows).
_FUNCTIONS = {
    operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub",
    operator.mul: "mul", torch.mul: "mul", operator.truediv: "div", torch.div: "div",
    operator.neg: "neg", torch.neg: "neg", torch.relu: "relu", F.relu: "relu",
    torch.sigmoid: "sigmoid", torch.tanh: "tanh", torch.exp: "exp", torch.sqrt: "sqrt",
    torch.rsqrt: "rsqrt", F.silu: "silu", F.gelu: "gelu", torch.square: "square",
    operator.pow: "pow", torch.pow: "pow",
}  # fmt: skip
_METHODS = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg", "relu": "relu",
    "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "square": "square", "pow": "pow",
}  # fmt: skip
_MODULES = {
    nn.ReLU: "relu",
    nn.SiLU: "silu",
    nn.GELU: "gelu",
    nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh",
}
_GEMM_FUNCTIONS = {F.linear, torch.matmul, torch.mm, torch.bmm, operator.matmul}
_NORM_MODULES = (nn.LayerNorm, nn.RMSNorm)


@dataclass
class NodeInfo:
    """What the analyzer knows of one node."""

    node: fx.Node
    kind: str  # "elementwise", "gemm", "norm", "softmax", "other"
    op: str = ""  # the elementwise op name ("add", "gelu", ...)
    shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = None


@dataclass
class FusionGroup:
    """A set of nodes that one kernel could compute."""

    index: int
    kind: str  # "elementwise", "epilogue", "prologue", "attention"
    nodes: list[fx.Node] = field(default_factory=list)  # in graph order
    anchor: fx.Node | None = None  # the GEMM / norm / first matmul it attaches to
    pattern: str = ""  # the tritonkit operator it maps to, or "generated" / ""
    note: str = ""  # why it cannot be fused, when it cannot

    @property
    def output(self) -> fx.Node:
        return self.nodes[-1]

    def ops(self, infos: dict[fx.Node, NodeInfo]) -> list[str]:
        return [infos[n].op or infos[n].kind for n in self.nodes]


def _meta(node: fx.Node) -> tuple[tuple[int, ...], torch.dtype | None]:
    tm = node.meta.get("tensor_meta")
    if tm is None or not hasattr(tm, "shape"):
        return (), None
    return tuple(tm.shape), tm.dtype


def classify(gm: fx.GraphModule, node: fx.Node) -> NodeInfo:
    """The node's kind and elementwise op, from its target."""
    shape, dtype = _meta(node)
    info = NodeInfo(node, "other", shape=shape, dtype=dtype)
    if node.op == "call_function":
        if node.target in _FUNCTIONS:
            info.kind, info.op = "elementwise", _FUNCTIONS[node.target]
        elif node.target in _GEMM_FUNCTIONS:
            info.kind = "gemm"
        elif node.target in (F.layer_norm, F.rms_norm):
            info.kind = "norm"
        elif node.target in (F.softmax, torch.softmax):
            info.kind = "softmax"
    elif node.op == "call_method":
        if node.target in _METHODS:
            info.kind, info.op = "elementwise", _METHODS[node.target]
        elif node.target == "softmax":
            info.kind = "softmax"
    elif node.op == "call_module":
        mod = gm.get_submodule(node.target)
        kind = next((v for k, v in _MODULES.items() if type(mod) is k), None)
        if kind is not None and not getattr(mod, "inplace", False):
            info.kind, info.op = "elementwise", kind
        elif isinstance(mod, nn.Linear):
            info.kind = "gemm"
        elif isinstance(mod, _NORM_MODULES):
            info.kind = "norm"
        elif isinstance(mod, nn.Softmax):
            info.kind = "softmax"
    if info.kind == "elementwise" and (dtype is None or not dtype.is_floating_point):
        info.kind = "other"  # integer math and untyped values stay as they are
    return info


class FusionAnalyzer:
    """Finds the fusable groups of ``gm`` (a GraphModule whose nodes carry ``tensor_meta``,
    as ``torch.fx.passes.shape_prop.ShapeProp`` leaves them)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.infos: dict[fx.Node, NodeInfo] = {n: classify(gm, n) for n in gm.graph.nodes}

    def groups(self) -> list[FusionGroup]:
        infos = self.infos
        group_of: dict[fx.Node, FusionGroup] = {}
        groups: list[FusionGroup] = []
        for node in self.gm.graph.nodes:
            info = infos[node]
            if info.kind != "elementwise":
                continue
            target = None
            for inp in node.all_input_nodes:
                g = group_of.get(inp)
                if g is not None and len(inp.users) == 1 and infos[inp].shape == info.shape:
                    if target is None:
                        target = g
                    elif g is not target:  # two chains meet here: one group
                        target.nodes = sorted(target.nodes + g.nodes, key=self._order)
                        for n in g.nodes:
                            group_of[n] = target
                        groups.remove(g)
            if target is None:
                target = FusionGroup(len(groups), "elementwise")
                groups.append(target)
            target.nodes.append(node)
            group_of[node] = target
        for g in groups:
            self._attach(g)
        attention = self._attention()
        taken = {n for g in attention for n in g.nodes}
        groups = [g for g in groups if not taken.intersection(g.nodes)] + attention
        for i, g in enumerate(groups):
            g.index = i
        return groups

    def _order(self, node: fx.Node) -> int:
        if not hasattr(self, "_positions"):
            self._positions = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        return self._positions[node]

    def external_inputs(self, g: FusionGroup) -> list[fx.Node]:
        """The tensors a group reads from outside it, in first-use order."""
        inside = set(g.nodes)
        seen: list[fx.Node] = []
        for n in g.nodes:
            for inp in n.all_input_nodes:
                if inp not in inside and inp not in seen:
                    seen.append(inp)
        return seen

    def escaping(self, g: FusionGroup) -> list[fx.Node]:
        """The group's nodes whose value is read outside the group."""
        inside = set(g.nodes)
        return [n for n in g.nodes if any(u not in inside for u in n.users)]

    def _attach(self, g: FusionGroup) -> None:
        infos = self.infos
        first = g.nodes[0]
        ops = g.ops(infos)
        # act(gate) * up: a GLU, also when gate and up are GEMM outputs (tritonkit's GLU
        # reads them; its backward exists, an epilogue of two GEMMs does not).
        if ops in (["silu", "mul"], ["gelu", "mul"]) and len(self.external_inputs(g)) == 2:
            g.pattern = "tritonkit.swiglu" if ops[0] == "silu" else "tritonkit.geglu"
            return
        gemms = [
            i for i in self.external_inputs(g) if infos[i].kind == "gemm" and len(i.users) == 1
        ]
        if gemms and gemms[0] in first.all_input_nodes:
            g.kind, g.anchor = "epilogue", gemms[0]
            g.pattern = self._epilogue_pattern(g)
            return
        out = g.output
        users = list(out.users)
        if (
            ops == ["add"]
            and len(users) >= 1
            and any(infos[u].kind == "norm" for u in users)
            and all(infos[i].shape == infos[out].shape for i in self.external_inputs(g))
        ):
            norm = next(u for u in users if infos[u].kind == "norm")
            g.kind, g.anchor = "prologue", norm
            g.pattern = self._norm_pattern(norm)
            return
        g.pattern = "generated"

    def _epilogue_pattern(self, g: FusionGroup) -> str:
        """tritonkit.linear's epilogue is [+ bias] -> [activation] -> [+ residual], on a
        ``nn.Linear`` or ``F.linear`` GEMM."""
        ops = g.ops(self.infos)
        i = 0
        if i < len(ops) and ops[i] == "add" and self._is_vector_add(g.nodes[i], g):
            i += 1
        if i < len(ops) and ops[i] in ("relu", "gelu", "silu"):
            i += 1
        if i < len(ops) and ops[i] == "add":
            i += 1
        a = g.anchor
        linear = a.op == "call_module" or a.target is F.linear
        if i != len(ops) or not linear:
            g.note = f"tritonkit.linear's epilogue is [+bias] [activation] [+residual]; got {ops}"
            return ""
        return "tritonkit.linear"

    def _is_vector_add(self, node: fx.Node, g: FusionGroup) -> bool:
        others = [i for i in node.all_input_nodes if i not in g.nodes and i is not g.anchor]
        return len(others) == 1 and len(self.infos[others[0]].shape) == 1

    def _norm_pattern(self, norm: fx.Node) -> str:
        if norm.op == "call_module":
            mod = self.gm.get_submodule(norm.target)
            return (
                "tritonkit.add_rms_norm"
                if isinstance(mod, nn.RMSNorm)
                else "tritonkit.add_layer_norm"
            )
        return "tritonkit.add_rms_norm" if norm.target is F.rms_norm else "tritonkit.add_layer_norm"

    def _attention(self) -> list[FusionGroup]:
        """``softmax(matmul(q, k^T) [* or / scalar]) @ v`` chains."""
        infos = self.infos
        found = []
        for node in self.gm.graph.nodes:
            if infos[node].kind != "softmax" or len(node.users) != 1:
                continue
            (pv,) = node.users
            if infos[pv].kind != "gemm":
                continue
            chain = [node]
            src = node.args[0] if node.args else None
            while isinstance(src, fx.Node) and infos[src].kind == "elementwise":
                chain.insert(0, src)
                src = src.args[0] if src.args else None
            if not isinstance(src, fx.Node) or infos[src].kind != "gemm":
                continue
            g = FusionGroup(0, "attention", [src, *chain, pv], anchor=src)
            g.pattern = "tritonkit.attention"
            found.append(g)
        return found
