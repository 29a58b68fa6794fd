"""Fewer knobs, the same launches: the configs' fields are counted against a ceiling, and the
launches a grid of calls per family makes (kernel, grid, constexprs, launch options, scalar
arguments, the shapes and dtypes of the tensors it is given) are compared with those recorded
in tests/data/launch_params.json before the configs were cut down.

Nothing is launched: the calls run in ``tritonkit.warmup``'s mode (``launch.WARMUP.session``),
whose session here writes down each launch instead of compiling it. The device properties the
plans read (SM count, shared memory per program) are set to an H100's and to the interpreter's
stand-ins in turn, so that the branches a GPU takes are recorded too.

``TRITONKIT_RECORD_LAUNCHES=1`` writes the file anew (only when a change of launch is meant).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import pathlib
import sys

import pytest
import torch

from tritonkit.ops._core import device as _device
from tritonkit.ops._core import launch as _launch
from tritonkit.ops._core import replay
from tritonkit.ops._core.plan import PLANS

from _checks import DEVICE

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "launch_params.json"

# The ratchet: the fields of every ...Config dataclass in src/tritonkit, and the largest one.
MAX_TOTAL_FIELDS = 204
MAX_FIELDS = 8


def config_fields() -> dict[str, int]:
    """Fields of each ``@dataclass`` whose name ends in ``Config`` under src/tritonkit (ClassVars
    are not fields), by ``path:Name``."""
    out = {}
    for path in sorted((ROOT / "src" / "tritonkit").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ClassDef) and node.name.endswith("Config")):
                continue
            if not any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                continue
            n = sum(
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and "ClassVar" not in ast.unparse(stmt.annotation)
                for stmt in node.body
            )
            out[f"{path.relative_to(ROOT / 'src')}:{node.name}"] = n
    return out


def test_config_fields_ceiling():
    fields = config_fields()
    total = sum(fields.values())
    big = {k: v for k, v in fields.items() if v > MAX_FIELDS}
    assert total <= MAX_TOTAL_FIELDS, (total, sorted(fields.items(), key=lambda kv: -kv[1])[:8])
    assert not big, big


# ---- the launches ---------------------------------------------------------------------------


def _value(a):
    if isinstance(a, torch.Tensor):
        return f"T({str(a.dtype)[6:]},{tuple(a.shape)},{tuple(a.stride())})"
    if isinstance(a, float):
        return repr(a)
    if isinstance(a, (bool, int, str)) or a is None:
        return a
    if isinstance(a, (tuple, list)):
        return [_value(x) for x in a]
    if isinstance(a, torch.dtype):
        return str(a)
    if hasattr(a, "__name__"):
        return f"<{a.__name__}>"
    return type(a).__name__


class _Writer:
    """A warmup session that writes each launch down and compiles nothing."""

    def __init__(self):
        self.launches: list[dict] = []

    def launch(self, kernel, grid, args, meta):
        if callable(grid):
            grid = grid(dict(meta))
        self.launches.append(
            {
                "kernel": kernel.__name__,
                "grid": [int(g) for g in grid],
                "meta": {k: _value(v) for k, v in sorted(meta.items())},
                "args": [_value(a) for a in args],
            }
        )


def _import_all() -> None:
    """Every tritonkit module imported before any properties are patched: a module first
    imported inside a patched case would bind the stub by name and keep it after the case
    (its later cases, the interpreter's included, would plan for an H100)."""
    import importlib
    import pkgutil

    import tritonkit

    for info in pkgutil.walk_packages(tritonkit.__path__, "tritonkit."):
        if info.name.split(".")[1] in ("ops", "optim", "quant", "sparse", "nn", "functional"):
            importlib.import_module(info.name)


@contextlib.contextmanager
def _device_props(sms: int | None, smem: int | None):
    """``sm_count`` / ``shared_memory_per_block`` give ``sms`` / ``smem`` in every module that
    imported them (None: the interpreter's stand-ins)."""
    patched = []
    originals = {_device.sm_count: sms, _device.shared_memory_per_block: smem}
    for name, module in list(sys.modules.items()):
        if not name.startswith("tritonkit") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            for orig, fixed in originals.items():
                if value is orig and fixed is not None:
                    stub = (lambda f: lambda device: f)(fixed)
                    setattr(module, attr, stub)
                    patched.append((module, attr, orig))
    try:
        yield
    finally:
        for module, attr, orig in patched:
            setattr(module, attr, orig)


def _rand(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, device=DEVICE, dtype=dtype).requires_grad_(grad)


def _backward(y):
    y.backward(torch.ones_like(y))


# Shapes: narrow rows (several per tile), rows in registers, the row kernel, wide rows (looped),
# odd widths; fp32 and bf16; forward alone and with the backward.
ROWS = [(64, 1000), (8, 4096), (4, 20000), (2, 70000), (16, 130)]
DTYPES = [torch.float32, torch.bfloat16]


def _norm_cases():
    import tritonkit as tk

    for m, n in ROWS:
        for dt in DTYPES:
            for name in ("rms_norm", "layer_norm"):
                for res in (False, True):

                    def case(m=m, n=n, dt=dt, name=name, res=res):
                        x = _rand(m, n, dtype=dt, grad=True)
                        w = _rand(n, dtype=dt, grad=True)
                        kw = {"bias": _rand(n, dtype=dt, grad=True)} if name == "layer_norm" else {}
                        if res:
                            r = _rand(m, n, dtype=dt, grad=True)
                            f = getattr(tk, "add_" + name)
                            out = f(x, r, w, kw["bias"]) if name == "layer_norm" else f(x, r, w)
                            out = out[0] + out[1]
                        else:
                            f = getattr(tk, name)
                            out = f(x, (n,), w, **kw)
                        _backward(out)

                    yield f"norm/{name}/res={res}/{m}x{n}/{dt}", case
    # a transposed input (adjacent rows)
    for dt in DTYPES:

        def case_t(dt=dt):
            x = _rand(512, 64, dtype=dt, grad=True)
            w = _rand(512, dtype=dt, grad=True)
            _backward(tk.rms_norm(x.t(), 512, w))

        yield f"norm/rms_norm/transposed/{dt}", case_t


def _softmax_cases():
    import tritonkit as tk

    for m, n in ROWS:
        for dt in DTYPES:
            for name in ("softmax", "log_softmax"):

                def case(m=m, n=n, dt=dt, name=name):
                    x = _rand(m, n, dtype=dt, grad=True)
                    _backward(getattr(tk, name)(x, -1))

                yield f"softmax/{name}/{m}x{n}/{dt}", case

    def case_dim0():
        _backward(tk.softmax(_rand(300, 17, grad=True), 0))

    yield "softmax/softmax/dim0", case_dim0


def _cross_entropy_cases():
    import tritonkit as tk

    for m, n in [(64, 1000), (8, 32000), (4, 131072), (33, 50)]:
        for dt in DTYPES:
            for smoothing in (0.0, 0.1):

                def case(m=m, n=n, dt=dt, smoothing=smoothing):
                    x = _rand(m, n, dtype=dt, grad=True)
                    t = torch.randint(0, n, (m,), device=DEVICE)
                    _backward(tk.cross_entropy(x, t, label_smoothing=smoothing))

                yield f"cross_entropy/{m}x{n}/{dt}/ls={smoothing}", case

                def case_soft(m=m, n=n, dt=dt):
                    x = _rand(m, n, dtype=dt, grad=True)
                    t = torch.softmax(_rand(m, n), -1).to(dt)
                    _backward(tk.cross_entropy(x, t))

            yield f"cross_entropy/soft/{m}x{n}/{dt}", case_soft


def _matmul_cases():
    import tritonkit as tk

    for m, n, k in [
        (64, 64, 64),
        (512, 256, 1024),
        (8, 4096, 4096),
        (1, 1000, 300),
        (32, 256, 8192),
        (4096, 4096, 512),
    ]:
        for dt in [torch.float32, torch.bfloat16, torch.float16]:

            def case(m=m, n=n, k=k, dt=dt):
                a, b = _rand(m, k, dtype=dt, grad=True), _rand(k, n, dtype=dt, grad=True)
                _backward(tk.matmul(a, b))

            yield f"matmul/{m}x{n}x{k}/{dt}", case

            def case_lin(m=m, n=n, k=k, dt=dt):
                x, w = _rand(m, k, dtype=dt, grad=True), _rand(n, k, dtype=dt, grad=True)
                _backward(tk.linear(x, w, _rand(n, dtype=dt, grad=True)))

            yield f"linear/{m}x{n}x{k}/{dt}", case_lin

    def case_int8():
        a = torch.randint(-127, 127, (64, 256), device=DEVICE, dtype=torch.int8)
        b = torch.randint(-127, 127, (256, 128), device=DEVICE, dtype=torch.int8)
        tk.int8_matmul(a, b)

    yield "matmul/int8", case_int8


def _pointwise_cases():
    import tritonkit as tk

    for shape in [(64, 1000), (3, 5, 7), (1 << 20,)]:
        for dt in DTYPES:

            def case(shape=shape, dt=dt):
                _backward(tk.gelu(_rand(*shape, dtype=dt, grad=True)))
                _backward(tk.silu(_rand(*shape, dtype=dt, grad=True)))

            yield f"pointwise/{shape}/{dt}", case

    def case_bias_act():
        x, b = _rand(64, 300, grad=True), _rand(300, grad=True)
        _backward(tk.bias_act(x, b, "gelu"))

    yield "pointwise/bias_act", case_bias_act


def _small_cases():
    import tritonkit as tk

    for dt in DTYPES:

        def case_rope(dt=dt):
            x = _rand(2, 4, 16, 64, dtype=dt, grad=True)
            cos, sin = _rand(16, 64, dtype=dt), _rand(16, 64, dtype=dt)
            _backward(tk.rope(x, cos, sin))

        yield f"rope/{dt}", case_rope

        def case_memory(dt=dt):
            tk.transpose(_rand(300, 500, dtype=dt))
            tk.copy(_rand(300, 500, dtype=dt).t())

        yield f"memory/{dt}", case_memory


def _quant_cases():
    from tritonkit import quant

    for dt in DTYPES:
        for gran in ("tensor", "row"):

            def case(dt=dt, gran=gran):
                quant.quantize(_rand(64, 512, dtype=dt), torch.int8, granularity=gran)

            yield f"quant/{gran}/{dt}", case


def _optim_cases():
    from tritonkit import optim

    for cls in ("AdamW", "Muon"):

        def case(cls=cls):
            ps = [torch.nn.Parameter(_rand(64, 128)), torch.nn.Parameter(_rand(300, 40))]
            for p in ps:
                p.grad = _rand(*p.shape)
            getattr(optim, cls)(ps, lr=1e-3).step()

        yield f"optim/{cls}", case


def _sparse_cases():
    from tritonkit import sparse

    def case():
        dense = _rand(64, 96) * (torch.rand(64, 96, device=DEVICE) < 0.1)
        a = sparse.CSR.from_dense(dense)
        sparse.spmv(a, _rand(96))
        sparse.spmm(a, _rand(96, 32))

    yield "sparse/csr", case


FAMILIES = {
    "norm": _norm_cases,
    "softmax": _softmax_cases,
    "cross_entropy": _cross_entropy_cases,
    "matmul": _matmul_cases,
    "pointwise": _pointwise_cases,
    "small": _small_cases,
    "quant": _quant_cases,
    "optim": _optim_cases,
    "sparse": _sparse_cases,
}
PROPS = {"h100": (132, 232448), "interpreter": (None, None)}


def record(family: str) -> dict[str, list]:
    """{case: its launches, or the error it raised} for one family, under each set of device
    properties."""
    _import_all()
    out: dict[str, list] = {}
    for props, (sms, smem) in PROPS.items():
        for name, case in FAMILIES[family]():
            writer = _Writer()
            torch.manual_seed(0)
            with contextlib.ExitStack() as stack:
                stack.enter_context(_device_props(sms, smem))
                stack.enter_context(PLANS.isolated())
                stack.enter_context(replay.suspended())
                _launch.WARMUP.session = writer
                try:
                    case()
                    result = writer.launches
                except Exception as exc:
                    result = [f"raised {type(exc).__name__}"]
                finally:
                    _launch.WARMUP.session = None
            out[f"{props}/{name}"] = result
    return out


@pytest.mark.interpreter
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_launches_unchanged(family):
    """Every launch of the grid of calls is the one recorded before the configs changed."""
    got = record(family)
    launched = [
        case for case, launches in got.items() if launches and isinstance(launches[0], dict)
    ]
    assert len(launched) == len(got), sorted(set(got) - set(launched))
    if os.environ.get("TRITONKIT_RECORD_LAUNCHES") == "1":
        data = json.loads(DATA.read_text()) if DATA.exists() else {}
        data[family] = got
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(dict(sorted(data.items())), indent=0, sort_keys=True) + "\n")
    want = json.loads(DATA.read_text())[family]
    assert sorted(got) == sorted(want)
    for case in sorted(want):
        assert got[case] == want[case], case
