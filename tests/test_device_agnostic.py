"""The test files build their tensors where the tests run: on a GPU machine a CPU tensor handed
to a tritonkit kernel fails ("must be on a CUDA device, got cpu"), a failure that the CPU runs
of the suite never show.

A static check (the syntax tree of every file under tests/): each call of a torch tensor
factory (``torch.randn``, ``torch.empty``, ``torch.tensor``, ..., and ``torch.Generator``) says
where its tensor goes, by a ``device=`` keyword (or ``**kwargs``), by a device as a Generator's
first argument, or by an immediate ``.to(...)`` of a device (``.to(device)``,
``.to(x.device)``); and no call names the CPU itself (``device="cpu"``,
``torch.device("cpu")``: a check engine run on the CPU, as test_harness_kinds.py's were). A
tensor that is on the host by design (a host-side policy, a float64 reference computed on the
CPU) says so on its line: ``# host: <why>``. The files below are allowed as a whole, each with
its reason. Not checked: modules built without a device (a tritonkit module handed CPU
parameters fails the same way; ``.to(device)`` them).

A test that needs one kind of machine is marked instead (``gpu``, ``interpreter``: conftest.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tritonkit import scaffold

TESTS = Path(__file__).resolve().parent

FACTORIES = {
    "arange", "empty", "eye", "full", "linspace", "ones", "rand", "randint", "randn", "randperm",
    "tensor", "zeros", "Generator",
}  # fmt: skip

# Files whose tensors are on the host by design: nothing of theirs reaches a GPU kernel.
HOST_FILES = {
    "test_interpreter.py": "interpreter-only (pytest.mark.interpreter): its own rounding, on CPU",
    "test_launch.py": "a stand-in kernel and launcher: no tensor reaches a kernel",
    "test_replay.py": "stand-in kernels compute with NumPy; replay.cpp's test launcher (on_host)",
}

# Files of other owners, being made device-agnostic on their own branches: at most this many
# unmarked factory calls each (the count may only fall). Once a file has none left, its entry
# must go: the test fails on a stale entry, so this list only shrinks.
PENDING = {
    "test_clip.py": 4,
    "test_cross_entropy.py": 1,
    "test_elementwise.py": 4,
    "test_harness.py": 13,
    "test_matmul.py": 1,
    "test_patch.py": 24,
    "test_quant.py": 13,
}

_HOST_NOTE = re.compile(r"#\s*host:\s*\S")


def _names_the_cpu(call: ast.Call) -> bool:
    """``device="cpu"`` or ``torch.device("cpu")``."""

    def cpu(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value == "cpu"

    if any(k.arg == "device" and cpu(k.value) for k in call.keywords):
        return True
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "device"
        and isinstance(func.value, ast.Name)
        and func.value.id == "torch"
        and bool(call.args)
        and cpu(call.args[0])
    )


def _says_where(call: ast.Call, to_call: ast.Call | None) -> bool:
    """Whether a factory call names its device; ``to_call``: the ``.to(...)`` call it is the
    receiver of, if any."""
    if any(k.arg in ("device", None) for k in call.keywords):  # None: **kwargs
        return True
    if call.func.attr == "Generator" and call.args:  # torch.Generator("cuda")
        return True
    if to_call is not None:  # torch.randn(...).to(device) / .to(x.device)
        text = " ".join(ast.unparse(a) for a in [*to_call.args, *to_call.keywords])
        return "device" in text.lower()
    return False


def unplaced_factories(source: str) -> list[tuple[int, str]]:
    """(line, source line) of each torch factory call that does not say where its tensor goes,
    and of each call that names the CPU, without a ``# host:`` note; in line order."""
    tree = ast.parse(source)
    lines = source.splitlines()
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    # x.to(...): the call whose callee is the attribute ``.to`` of x, by x
    to_calls = {
        c.func.value: c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "to"
    }
    found = []
    for node in calls:
        factory = (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
            and node.func.attr in FACTORIES
        )
        if not _names_the_cpu(node) and not (factory and not _says_where(node, to_calls.get(node))):
            continue
        span = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
        if any(_HOST_NOTE.search(line) for line in span):
            continue
        found.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(found)


def _files() -> list[Path]:
    return sorted(TESTS.glob("*.py"))


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_tensors_are_built_on_the_test_device(path):
    if path.name in HOST_FILES:
        pytest.skip(f"host by design: {HOST_FILES[path.name]}")
    found = unplaced_factories(path.read_text())
    where = "\n".join(f"{path.name}:{line}: {text}" for line, text in found)
    if path.name in PENDING:
        limit = PENDING[path.name]
        assert found, f"{path.name} builds every tensor with a device now: drop it from PENDING"
        assert len(found) <= limit, f"{len(found)} > {limit} unplaced factory calls:\n{where}"
        return
    assert not found, (
        "tensors built without a device (device=DEVICE / the device fixture; '# host: why' "
        f"where the host is meant):\n{where}"
    )


def test_allowed_files_exist():
    names = {p.name for p in _files()}
    assert set(HOST_FILES) <= names and set(PENDING) <= names


def test_the_scaffolded_test_builds_on_the_device():
    """``tritonkit new``'s test template, as it is written out."""
    assert unplaced_factories(scaffold.render("test.py.tmpl", "probe")) == []


def test_the_check_sees_what_it_must():
    source = """
import torch
a = torch.randn(3)
b = torch.randn(3, device=device)
c = torch.zeros(2, **kw)
d = torch.randn(3, generator=g).to(device)
e = torch.randn(3).to(torch.float16)
f = torch.Generator()
g = torch.Generator(device=device)
h = torch.Generator("cuda")
i = torch.arange(4)  # host: a float64 reference's indices
j = torch.tensor(
    [1, 2],
)
k = torch.randn_like(b)
m = torch.randn(3, device="cpu")
n = check_spec(spec, device="cpu")
o = x.to(torch.device("cpu"))
p = torch.device("cuda")
"""
    assert [line for line, _ in unplaced_factories(source)] == [3, 7, 8, 12, 16, 17, 18]
