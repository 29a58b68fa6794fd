"""The layering docs/DESIGN.md states, read from the source: no import cycle anywhere in
src/tritonkit (function-level imports included), ops/ never imports the workbench or the
public API layer, and the only edges between families are the ones DESIGN.md lists."""

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

# What ops/ may never import: everything above it in DESIGN.md's layers.
ABOVE_OPS = (
    *("harness", "specs", "cli", "cli_args", "cli_run", "cli_warmup", "models", "fusion"),
    *("nn", "optim", "quant", "sparse", "dist", "functional", "_warmup", "scaffold"),
)


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (SRC / "tritonkit").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _graph() -> dict[str, set[str]]:
    """Module -> the tritonkit modules it imports, anywhere in its body. An import of a package
    the module itself lives in is left out (Python initializes parents first)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.startswith("tritonkit") else None
                if target and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _family(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "ops" else None


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_ops_never_imports_the_layers_above_it():
    wrong = sorted(
        f"{mod} -> {target}"
        for mod, targets in _graph().items()
        if mod.startswith("tritonkit.ops")
        for target in targets
        if target.split(".")[1] in ABOVE_OPS
    )
    assert wrong == []


def test_edges_between_families_are_the_ones_design_lists():
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    declared = set(re.findall(r"`(\w+) -> (\w+)`", design))
    edges = {
        (_family(mod), _family(target))
        for mod, targets in _graph().items()
        for target in targets
        if _family(mod) and _family(target) and "_core" not in (_family(mod), _family(target))
        and _family(mod) != _family(target)
    }  # fmt: skip
    assert edges == declared, "update docs/DESIGN.md's list of edges between families"
    assert _cycles({a: {b} for a, b in edges}) == []


def test_the_checks_see_a_cycle_and_a_function_level_import():
    """The graph is read from function bodies too, and a two-module loop is reported."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    graph = _graph()
    # _tuning reads the hardware profile inside a function: the edge is still seen.
    assert "tritonkit._hardware" in graph["tritonkit._tuning"]


# Families not yet moved to the template's shape (issue 45): each leaves this list when it is.
NOT_YET_IN_SHAPE = {"attention", "matmul", "sparse"}


def _template_modules() -> set[str]:
    from tritonkit.scaffold import FILES

    return {
        Path(target).stem
        for target in FILES.values()
        if target.startswith("src/tritonkit/ops/{name}/")
    }


def test_every_family_has_the_shape_tritonkit_new_generates():
    """A family package holds the template's modules (kernels, config, plan, function and
    __init__), a large family's kernels split as ``kernels_<path>.py`` (with or without a
    ``kernels.py``), and nothing else."""
    template = _template_modules()
    assert template == {"__init__", "kernels", "config", "plan", "function"}
    ops = SRC / "tritonkit" / "ops"
    in_shape, not_in_shape = set(), set()
    for family in sorted(p.name for p in ops.iterdir() if (p / "__init__.py").is_file()):
        if family == "_core":
            continue
        modules = {p.stem for p in (ops / family).glob("*.py")}
        split = {m for m in modules if m.startswith("kernels_")}
        fits = modules - split in (template, template - ({"kernels"} if split else set()))
        (in_shape if fits else not_in_shape).add(family)
    assert not_in_shape == NOT_YET_IN_SHAPE, f"in the template's shape: {sorted(in_shape)}"


# Public calls whose route to the launch is still over 4 files (issue 45): none.
ROUTE_NOT_YET: set[str] = set()


def _route_files(call) -> list[list[str]]:
    """For each kernel launch of ``call``: the tritonkit files on the stack, from the public
    function's frame down to the launch, each counted once."""
    import traceback

    from tritonkit.ops._core import launch

    routes = []
    real, real_direct = launch.Kernel._launch, launch._direct

    def seen() -> None:
        frames = [f.filename for f in traceback.extract_stack()[:-2]]
        files = list(dict.fromkeys(f.split("/src/")[1] for f in frames if "/src/tritonkit/" in f))
        routes.append(files)

    def spy(self, grid, args, meta):
        seen()
        return real(self, grid, args, meta)

    def spy_direct(*args, **kwargs):  # a bound launch (launch.Bound) skips Kernel._launch
        seen()
        return real_direct(*args, **kwargs)

    launch.Kernel._launch, launch._direct = spy, spy_direct
    try:
        call()
    finally:
        launch.Kernel._launch, launch._direct = real, real_direct
    return routes


def test_public_calls_reach_their_launches_through_at_most_four_files(device):
    """A cold and a warm call of rms_norm, softmax, attention, linear and AdamW.step, from the
    public function (or the optimizer's step) down to each kernel launch from Python."""
    import torch

    import tritonkit
    from tritonkit.ops._core import replay

    x = torch.randn(16, 96, device=device)
    w = torch.randn(96, device=device)
    q = torch.randn(1, 2, 16, 32, device=device)
    params = [torch.nn.Parameter(torch.randn(50, device=device)) for _ in range(2)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = tritonkit.optim.AdamW(params)
    calls = {
        "rms_norm": lambda: tritonkit.rms_norm(x, (96,), w),
        "softmax": lambda: tritonkit.softmax(x, -1),
        "attention": lambda: tritonkit.attention(q, q, q),
        "linear": lambda: tritonkit.linear(x, torch.ones(24, 96, device=device)),
        "AdamW.step": opt.step,
    }
    over = {}
    with replay.suspended():  # the Python route (a replayed call launches from C++)
        for name, call in calls.items():
            for when in ("cold", "warm"):
                routes = _route_files(call)
                assert routes, f"{name} ({when}) launched nothing from Python"
                longest = max(routes, key=len)
                if len(longest) > 4:
                    over[name] = longest
    assert set(over) == ROUTE_NOT_YET, over
