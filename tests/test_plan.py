"""The plan layer (ops/_core/plan.py): one cache keyed by (meta, env), a call after a change
of env equal to a call in a fresh cache under that env, threads kept apart, and the private
interfaces named in one place."""

import ast
import contextlib
import os
import threading
from pathlib import Path

import pytest
import torch

from tritonkit.harness.spec import all_specs
from tritonkit.ops._core import internals
from tritonkit.ops._core.plan import PLANS, cached, current_env, validated

SRC = Path(__file__).resolve().parents[1] / "src" / "tritonkit"


# ---- the private interfaces ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(internals.NAMES))
def test_private_interfaces_resolve(name):
    owner, path = internals.NAMES[name]
    try:
        internals.resolve(owner, path)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{owner}.{path} ({name}) moved in this PyTorch/Triton: {exc}")


@pytest.mark.gpu  # CUDA-only names
@pytest.mark.parametrize("name", sorted(internals.CUDA_NAMES))
def test_private_cuda_interfaces_resolve(name):
    owner, path = internals.CUDA_NAMES[name]
    internals.resolve(owner, path)


def test_private_names_used_only_in_internals():
    """No module but internals.py reaches a private torch._C / Triton runtime name."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "internals.py":
            continue
        text = path.read_text()
        for needle in ("torch._C._", "device_caches", "triton.runtime._", "_python_dispatch"):
            if needle in text:
                offenders.append(f"{path.relative_to(SRC)}: {needle}")
    assert not offenders, offenders


# ---- one cache -------------------------------------------------------------------------------

# Module-level names that look like caches but are not caches of launches, plans or
# validations, each with why.
_NOT_PLAN_CACHES = {
    ("_tuning.py", "_memory"),  # the tuning file's entries as read from disk
    ("_tuning.py", "_shipped"),  # the shipped tables (package data) as read, per GPU
    ("ops/_core/launch.py", "_SCRATCH"),  # a scratch buffer per (device, stream)
    ("ops/_core/internals.py", "_ENCODED"),  # environment variable names, encoded once
    ("ops/_core/registry.py", "_LIBRARIES"),  # torch.library namespaces
    ("_autocast.py", "POLICIES"),  # each public function's declared autocast policy
    ("ops/_core/device.py", "@functools.cache shared_memory_per_block"),  # hardware facts
    ("ops/_core/device.py", "@functools.cache sm_count"),
    ("harness/spec.py", "_REGISTRY"),  # the OpSpec registry
    ("harness/timing.py", "@functools.cache _flush_buffer"),  # the bench's L2 flush buffer
    ("specs/_cuda_gelu.py", "@functools.lru_cache(maxsize=1) _module"),  # a compiled baseline
    ("ops/collectives/plan.py", "_WORKSPACES"),  # symmetric-memory buffers per (group, size)
    ("harness/bench_cases.py", "_TIMED"),  # the calls a bench case timed, for its energy pass
    ("harness/energy.py", "_NVML"),  # the NVML library handle per device, opened once
    ("harness/kernel_stats.py", "_STATIC_CACHE"),  # a case's sm_90 figures, compiled once
}


def _module_level_caches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for t in targets:
            if not isinstance(t, ast.Name):
                continue
            empty_dict = isinstance(value, ast.Dict) and not value.keys
            dict_call = (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in ("dict", "OrderedDict", "WeakValueDictionary")
            )
            if empty_dict or dict_call:
                found.append(t.id)
        decorators = getattr(node, "decorator_list", [])
        for d in decorators:
            text = ast.unparse(d)
            if "lru_cache" in text or text.endswith("cache"):
                found.append(f"@{text} {node.name}")
    text = path.read_text()
    if "lru_cache(" in text and not any(f.startswith("@") for f in found):
        found.append("functools.lru_cache(...)")
    return found


def test_one_plan_cache():
    """No module of src/ keeps a module-level dict or functools cache of its own: launches,
    plans and validations live in plan.PLANS."""
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = str(path.relative_to(SRC))
        for name in _module_level_caches(path):
            if (rel, name) not in _NOT_PLAN_CACHES:
                offenders.append(f"{rel}: {name}")
    assert not offenders, offenders


def test_the_cache_check_catches_a_cache(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import functools\n_PLANS: dict = {}\n@functools.lru_cache\ndef f(x):\n    pass\n"
    )
    assert _module_level_caches(bad) == ["_PLANS", "@functools.lru_cache f"]


def test_cached_once_per_key_and_env(monkeypatch):
    PLANS.reset()
    calls = []

    def build(value):
        return lambda: calls.append(value) or value

    assert cached("kern", ("n", 1), build(1)) == 1
    assert cached("kern", ("n", 1), build(2)) == 1  # kept
    assert cached("kern", ("n", 2), build(3)) == 3  # another key
    assert cached("other", ("n", 1), build(4)) == 4  # another decision
    monkeypatch.setenv("TRITONKIT_CACHE_DIR", "/nonexistent/elsewhere")  # another Env
    assert cached("kern", ("n", 1), build(5)) == 5
    assert cached("kern", ("n", 1), build(6)) == 5
    monkeypatch.setenv("TRITONKIT_AUTOTUNE_FORCE", "1")
    assert current_env().autotune == "force"  # a forced retune keeps nothing
    assert cached("kern", ("n", 1), build(7)) == 7
    assert cached("kern", ("n", 1), build(8)) == 8
    assert calls[:4] == [1, 3, 4, 5]


def test_validation_verdicts_are_kept_and_bad_calls_are_not():
    PLANS.reset()
    seen = []

    def ok():
        seen.append(1)
        return "verdict"

    assert validated("op", ("facts",), ok) == "verdict"
    assert validated("op", ("facts",), ok) == "verdict"
    assert seen == [1]

    def bad():
        raise ValueError("op: x must be ...")

    for _ in range(2):
        with pytest.raises(ValueError):
            validated("op", ("bad facts",), bad)


def test_eviction_keeps_the_newest():
    from tritonkit.ops._core.plan import PlanCache

    cache = PlanCache(limit=3)
    for i in range(5):
        cache.get(i, None, lambda i=i: i)
    assert len(cache) == 3 and cache.peek(4, None) == 4 and cache.peek(0, None) is None


# ---- every env change, every spec ------------------------------------------------------------


@contextlib.contextmanager
def _tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@contextlib.contextmanager
def _deterministic():
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old)


@contextlib.contextmanager
def _autocast(device):
    with torch.autocast(device.type, dtype=torch.bfloat16):
        yield


@contextlib.contextmanager
def _no_autotune():
    old = os.environ.get("TRITONKIT_AUTOTUNE")
    os.environ["TRITONKIT_AUTOTUNE"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITONKIT_AUTOTUNE", None)
        else:
            os.environ["TRITONKIT_AUTOTUNE"] = old


ENVS = {
    "tf32": lambda device: _tf32(),
    "deterministic": lambda device: _deterministic(),
    "autocast": _autocast,
    "no_autotune": lambda device: _no_autotune(),
}


def _call(spec, device, seed):
    shape = spec.shapes.test[-1]
    dtype = torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0]
    inputs = spec.make_inputs(shape, dtype, device, seed)
    out = spec.impl(*inputs, **dict(spec.params[0]))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    mutated = [inputs[i] for i in spec.mutates]
    return [o.detach().clone() for o in (*outs, *mutated) if isinstance(o, torch.Tensor)]


def _bits(t):
    """The tensor's bytes: equal bits, NaNs included, in any dtype (fp8 has no nan_to_num)."""
    return t.contiguous().view(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


def _same(a, b):
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(_bits(x), _bits(y))
        for x, y in zip(a, b)
    )


def _differential(spec, env_name, device):
    seed = 1234
    _call(spec, device, seed)  # plans under the default env
    with ENVS[env_name](device):
        after_change = _call(spec, device, seed)
    PLANS.reset()  # as a fresh process would find it
    with ENVS[env_name](device):
        fresh = _call(spec, device, seed)
    assert _same(after_change, fresh), f"{spec.name} under {env_name}: a plan outlived its env"


_SPECS = [s for s in all_specs() if s.distributed is None]
_FAST = {"rms_norm", "softmax", "matmul", "attention", "cross_entropy", "linear"}


@pytest.mark.parametrize("env_name", sorted(ENVS))
@pytest.mark.parametrize("spec", [s for s in _SPECS if s.name in _FAST], ids=lambda s: s.name)
def test_env_change_equals_fresh_cache(spec, env_name, device):
    _differential(spec, env_name, device)


@pytest.mark.slow
@pytest.mark.parametrize("env_name", sorted(ENVS))
@pytest.mark.parametrize("spec", [s for s in _SPECS if s.name not in _FAST], ids=lambda s: s.name)
def test_env_change_equals_fresh_cache_every_spec(spec, env_name, device):
    _differential(spec, env_name, device)


def test_a_plan_is_never_served_under_another_env(device):
    """The cache keys on the Env: a plan built with TF32 off is not the one a TF32 call gets."""
    import tritonkit

    PLANS.reset()
    a = torch.randn(33, 40, device=device)
    b = torch.randn(40, 24, device=device)
    tritonkit.matmul(a, b)
    before = {k for k, _ in PLANS.items()}
    with _tf32():
        tritonkit.matmul(a, b)
    after = {k for k, _ in PLANS.items()}
    new_envs = {env for (_, env) in after - before if env is not None}
    assert new_envs and all(env.tf32 for env in new_envs)


# ---- threads ---------------------------------------------------------------------------------


@pytest.mark.gpu  # Triton's CPU interpreter is not thread-safe
def test_two_threads_calling_different_ops(device):
    """Two threads calling different ops at once: each gets its own op's answer."""
    import tritonkit

    errors: list[str] = []
    x = torch.randn(37, 53, device=device)
    w = torch.randn(53, device=device)
    want_norm = torch.nn.functional.rms_norm(x.double(), (53,), w.double()).float()
    want_soft = torch.softmax(x.double(), -1).float()

    def run(fn, want, name):
        try:
            for _ in range(4):
                got = fn()
                if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                    errors.append(f"{name}: wrong answer")
        except Exception as exc:  # surfaced below
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(
            target=run, args=(lambda: tritonkit.rms_norm(x, (53,), w), want_norm, "rms")
        ),
        threading.Thread(target=run, args=(lambda: tritonkit.softmax(x, -1), want_soft, "softmax")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_no_config_dataclass_over_twelve_fields():
    """Every launch config (a dataclass named ...Config under ops/) has at most twelve fields:
    a path with more knobs is two kernels, or two configs."""
    import dataclasses
    import importlib
    import inspect
    import pkgutil

    import tritonkit.ops

    big = []
    for info in pkgutil.walk_packages(tritonkit.ops.__path__, "tritonkit.ops."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and dataclasses.is_dataclass(obj)
                and obj.__module__ == module.__name__
                and name.endswith("Config")
            ):
                n = len(dataclasses.fields(obj))
                if n > 12:
                    big.append(f"{module.__name__}.{name}: {n} fields")
    assert not big, big
