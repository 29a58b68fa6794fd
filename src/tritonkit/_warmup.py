"""``tritonkit.warmup``: compile, in parallel, the kernels that a model or a list of calls will
use, so that their first real calls load them instead of compiling.

A process from empty caches spends its first calls compiling: every kernel specialization a
call launches for the first time goes through Triton's front end, LLVM and ptxas, then its C
launcher through the C compiler, one after another on one core, while the GPU idles. Here the
calls run once in a mode where nothing is launched (``launch.WARMUP``): each launch that would
compile gives its specialization, exactly as Triton's launcher derives it (its binder: dtypes,
16-byte alignment, integers equal to 1 or divisible by 16, constexprs, launch options), and
its compile goes to a pool of threads (the compiler works without the GIL but for its Python
front end), with its C launcher after it. The kernels land in Triton's caches, in memory and
on disk, so the real calls that follow, in this process or a later one, load them.

What runs meanwhile is the calls' own Python (validation, plans, layouts, configs) and their
ATen ops, on values no kernel wrote: nothing on the host may read them, and tritonkit's default
paths do not. Nothing the calls can reach is changed by it:

- a tensor that existed before is written by an ATen op only through a copy (copy on write:
  parameters, buffers, inputs, gradients keep their values);
- what is decided meanwhile is forgotten (the plan cache is isolated), nothing is timed (a
  choice that would be tuned compiles every candidate instead) and the tuning cache is not
  written; replay is suspended; the random number generators are restored;
- every leaf a backward reached gets its ``.grad`` back; with a module and an optimizer, the
  optimizer that steps is a fresh one of the given optimizer's class over its parameter groups
  (its state, step count and random stream are not touched).

The records (``WarmupReport.records``: each kernel's module, name and Triton's serialized
specialization) can be compiled again elsewhere with ``compile_records``, for an explicit
target too (``GPUTarget("cuda", 90, 32)`` compiles for sm_90 without a GPU).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from tritonkit.ops._core import internals
from tritonkit.ops._core import launch as _launch

# The architecture records are made for under the interpreter (which compiles nothing): H100
# and H200, sm_90.
DEFAULT_TARGET = ("cuda", 90, 32)


@dataclass
class WarmupReport:
    """What ``warmup`` did: the kernel specializations its calls would compile, how many it
    compiled (or loaded from Triton's disk cache), which failed, and the time of each part."""

    records: list[dict] = field(default_factory=list)
    already: int = 0  # launches of specializations this process had compiled before
    compiled: int = 0
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # calls that raised while recorded
    record_s: float = 0.0
    compile_s: float = 0.0
    jobs: int = 0

    @property
    def kernels(self) -> int:
        return len(self.records)

    def __str__(self) -> str:
        text = (
            f"warmup: {self.kernels} kernel specializations recorded in {self.record_s:.2f} s, "
            f"{self.compiled} compiled in {self.compile_s:.2f} s on {self.jobs} threads"
        )
        if self.already:
            text += f" ({self.already} launches of kernels already compiled here)"
        for what, items in (("failed to compile", self.failed), ("calls raised", self.errors)):
            if items:
                text += f"\n  {len(items)} {what}: " + "; ".join(items[:3])
        return text


def default_jobs() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(32, cores or 1))


# ---- recording: the calls run, nothing is launched --------------------------------------------


class _Session:
    """Takes every launch while a warmup runs (``launch.WARMUP.session``): records the
    specialization of each one not compiled yet and, on a GPU, submits its compile."""

    def __init__(self, report: WarmupReport, pool: ThreadPoolExecutor | None, target: Any):
        self.report, self.pool, self.target = report, pool, target
        self.futures: list[tuple[Future, str]] = []
        self._seen: set = set()
        self._interpreted: dict[int, tuple] = {}

    def launch(self, kernel: _launch.Kernel, grid: Any, args: tuple, meta: dict) -> None:
        try:
            self._launch(kernel, args, meta)
        except Exception as exc:  # a launch Triton would refuse: the real call raises it
            self.report.failed.append(f"{kernel.__name__}: {type(exc).__name__}: {exc}"[:300])

    def _launch(self, kernel: _launch.Kernel, args: tuple, meta: dict) -> None:
        from triton import knobs

        if kernel._interpret:
            jit, backend, binder, key_cache, kernel_cache, device = self._interpreter(kernel)
        else:
            device = torch.cuda.current_device()
            jit, binder = kernel.fn, kernel.binder(device)[0]
            kernel_cache, key_cache, _, backend = internals.triton_device_cache(jit, device)
        # The keyword arguments as JITFunction.run completes them before it binds.
        kw = dict(meta)
        kw["debug"] = kw.get("debug", jit.debug) or knobs.runtime.debug
        kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        bound, spec, options = binder(*args, **kw)
        key = _compute_cache_key(key_cache, spec, options)
        if key in kernel_cache:
            self.report.already += 1
            return
        ident = (id(jit), device, key)
        if ident in self._seen:
            return
        self._seen.add(ident)
        opts, signature, constexprs, attrs = jit._pack_args(backend, kw, bound, spec, options)
        record = {
            "module": jit.fn.__module__,
            "qualname": jit.fn.__qualname__,
            "spec": _serialize(jit._fn_name, signature, constexprs, attrs, opts, key),
        }
        self.report.records.append(record)
        if self.pool is not None:
            self.futures.append((self.pool.submit(_compile_here, jit, record, device), key))

    def _interpreter(self, kernel: _launch.Kernel) -> tuple:
        """Under the interpreter (tests): the kernel's JITFunction and a binder for the
        default target, which specialize as a GPU would; nothing is compiled here."""
        cached = self._interpreted.get(id(kernel))
        if cached is None:
            import triton
            from triton.backends.compiler import GPUTarget
            from triton.compiler import make_backend

            interp = kernel.fn
            jit = triton.runtime.JITFunction(interp.fn, **getattr(interp, "kwargs", {}))
            backend = make_backend(GPUTarget(*(self.target or DEFAULT_TARGET)))
            binder = _binder_factory()(jit.signature, jit.params, backend)
            cached = self._interpreted[id(kernel)] = (jit, backend, binder, {}, {}, 0)
        return cached


def _compute_cache_key(key_cache: dict, spec: Any, options: Any) -> str:
    from triton.runtime.jit import compute_cache_key

    return compute_cache_key(key_cache, spec, options)


def _binder_factory() -> Callable:
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature


def _serialize(name, signature, constexprs, attrs, options, key) -> str:
    from triton.runtime.jit import serialize_specialization_data

    return serialize_specialization_data(name, signature, constexprs, attrs, options, key)


def _compile_here(jit: Any, record: dict, device: int) -> Any:
    """Compile one recorded specialization into this process's JIT function (where its real
    launch finds it) and Triton's disk cache, then its C launcher (into the disk cache)."""
    with torch.cuda.device(device):
        compiled = jit.preload(record["spec"])
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        internals.triton_driver().launcher_cls(compiled.src, compiled.metadata)
    return compiled


# ---- the sandbox: ATen ops run, what existed before is not written -----------------------------


def _storage_key(t: torch.Tensor) -> tuple | None:
    if t.device.type == "meta":
        return None
    ptr = t.untyped_storage().data_ptr()
    return None if ptr == 0 else (t.device, ptr)


class _Sandbox(internals.dispatch_mode_class()):
    """Copy on write for the tensors that existed before the warmup: an ATen op that writes
    one of them writes a copy (an in-place op still returns the tensor it was given, which
    keeps its values). Tensors made meanwhile (outputs that alias no input) are written as
    the calls write them."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # as recording.py's mode: never under Dynamo
        return False

    def __init__(self) -> None:
        super().__init__()
        self.fresh: set = set()
        self.copies = 0

    def _is_fresh(self, t: torch.Tensor) -> bool:
        key = _storage_key(t)
        return key is None or key in self.fresh

    def _cow(self, value: Any, swaps: dict[int, Any]) -> Any:
        if isinstance(value, torch.Tensor) and not self._is_fresh(value):
            copy = value.clone()
            self.fresh.add(_storage_key(copy))
            swaps[id(copy)] = value
            self.copies += 1
            return copy
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return type(value)(self._cow(v, swaps) for v in value)
        return value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        schema = func._schema
        swaps: dict[int, Any] = {}
        if schema.is_mutable:
            args = list(args)
            for i, a in enumerate(schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                if i < len(args) and not a.kwarg_only:
                    args[i] = self._cow(args[i], swaps)
                elif a.name in kwargs:
                    kwargs[a.name] = self._cow(kwargs[a.name], swaps)
        out = func(*args, **kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for ret, o in zip(schema.returns, outs):
            if ret.alias_info is None:  # a new tensor (or list of them), not a view
                for t in o if isinstance(o, (tuple, list)) else (o,):
                    if isinstance(t, torch.Tensor) and (key := _storage_key(t)) is not None:
                        self.fresh.add(key)
        if not swaps:
            return out

        def back(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return swaps.get(id(v), v)
            if isinstance(v, (tuple, list)):
                return type(v)(back(x) for x in v)
            return v

        return back(out)


def _leaves(roots: Iterable[Any]) -> list[torch.Tensor]:
    """The leaf tensors a backward from ``roots`` accumulates into (its AccumulateGrad nodes)."""
    nodes = [r.grad_fn for r in roots if isinstance(r, torch.Tensor) and r.grad_fn is not None]
    # Keyed by id and kept alive: a C++ node's Python wrapper is made on demand and freed with
    # its last reference, and a freed wrapper's id goes to the next one made (on the H100 the
    # input's AccumulateGrad node was skipped as "seen", and its .grad left behind).
    seen: dict[int, Any] = {}
    leaves = []
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        nodes.extend(n for n, _ in node.next_functions)
    return leaves


@contextlib.contextmanager
def _leaf_gradients_kept() -> Iterator[None]:
    """Within it, ``backward()`` runs as usual, and every leaf it reached gets its ``.grad``
    back at the end (the tensor it held before, or None): a warmed backward leaves no
    gradient behind for a training loop to accumulate into."""
    original = torch.autograd.backward
    kept: dict[int, tuple[torch.Tensor, Any]] = {}

    def backward(tensors, *args, **kwargs):
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        for leaf in _leaves(roots):
            kept.setdefault(id(leaf), (leaf, leaf.grad))
        return original(tensors, *args, **kwargs)

    torch.autograd.backward = backward
    try:
        yield
    finally:
        torch.autograd.backward = original
        for leaf, grad in kept.values():
            leaf.grad = grad


@contextlib.contextmanager
def recording(report: WarmupReport, jobs: int | None = None, target: Any = None) -> Iterator[Any]:
    """Within it, the calls made launch nothing: their kernels are recorded into ``report``
    and compiled on ``jobs`` threads (on a GPU). At the end, every compile has finished."""
    from tritonkit.ops._core import replay
    from tritonkit.ops._core.plan import PLANS

    if _launch.WARMUP.session is not None:
        raise RuntimeError("tritonkit.warmup: another warmup is running in this process")
    compile_here = torch.cuda.is_available() and not _launch._interpreting()
    report.jobs = (jobs or default_jobs()) if compile_here else 0
    pool = ThreadPoolExecutor(report.jobs, "tritonkit-warmup") if compile_here else None
    session = _Session(report, pool, target)
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    t0 = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=devices))
            stack.enter_context(PLANS.isolated())
            stack.enter_context(replay.suspended())
            stack.enter_context(torch.autograd.set_multithreading_enabled(False))
            stack.enter_context(_leaf_gradients_kept())
            stack.enter_context(_Sandbox())
            _launch.WARMUP.session = session
            try:
                yield session
            finally:
                _launch.WARMUP.session = None
    finally:
        report.record_s = time.perf_counter() - t0
        if pool is not None:
            t1 = time.perf_counter()
            for future, _ in session.futures:
                try:
                    future.result()
                    report.compiled += 1
                except Exception as exc:  # the real call compiles it again and raises
                    report.failed.append(f"{type(exc).__name__}: {exc}"[:300])
            pool.shutdown()
            report.compile_s = time.perf_counter() - t1


def _attempt(report: WarmupReport, what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # recorded so far is compiled; the real call raises it
        report.errors.append(f"{what}: {type(exc).__name__}: {exc}"[:300])
        return None


# ---- what to run -------------------------------------------------------------------------------


def _default_loss(output: Any) -> torch.Tensor | None:
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, dict):
        output = next(iter(output.values()), None)
    if isinstance(output, (tuple, list)):
        output = next((o for o in output if isinstance(o, torch.Tensor)), None)
    if isinstance(output, torch.Tensor) and output.requires_grad:
        return output.float().sum()
    return None


def _shadow_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A fresh optimizer of ``optimizer``'s class over copies of its parameter groups (the
    same parameters and hyperparameters), with tritonkit's constructor-only settings."""
    import inspect

    kwargs = {}
    params = inspect.signature(type(optimizer).__init__).parameters
    anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    guard = getattr(optimizer, "guard", None)
    for name, value in (("nonfinite", getattr(guard, "mode", None)),
                        ("chunks", getattr(optimizer, "chunks", None))):  # fmt: skip
        if value is not None and (name in params or anything):
            kwargs[name] = value
    groups = [{**g, "params": list(g["params"])} for g in optimizer.param_groups]
    return type(optimizer)(groups, **kwargs)


def _call_module(module, example_inputs, train, optimizer, loss_fn, report) -> None:
    if isinstance(example_inputs, dict):
        run = lambda: module(**example_inputs)  # noqa: E731
    elif isinstance(example_inputs, (tuple, list)):
        run = lambda: module(*example_inputs)  # noqa: E731
    else:
        run = lambda: module(example_inputs)  # noqa: E731
    if not train:
        with torch.no_grad():
            _attempt(report, "forward", run)
        return
    output = _attempt(report, "forward", run)
    loss = (loss_fn or _default_loss)(output) if output is not None else None
    if loss is not None:
        _attempt(report, "backward", loss.backward)  # the leaves' .grad put back at the end
    if optimizer is not None:
        shadow = _attempt(report, "optimizer", lambda: _shadow_optimizer(optimizer))
        if shadow is not None:
            _attempt(report, "optimizer step", shadow.step)


def _op_cases(ops: Iterable[Any]) -> list[tuple]:
    """(spec, shape, dtype) for each op given by name (its bench shapes and dtypes; the test
    shapes under the interpreter) or as a (name, shape, dtype) tuple."""
    from tritonkit.harness.spec import get_spec

    cases = []
    small = _launch._interpreting()
    for op in ops:
        if isinstance(op, str):
            spec = get_spec(op)
            shapes = spec.shapes.test[:1] if small else spec.shapes.bench
            cases += [(spec, s, d) for s in shapes for d in spec.bench_dtypes]
        else:
            name, shape, dtype = op
            cases.append((get_spec(name), shape, dtype))
    return [c for c in cases if c[0].distributed is None]


def warmup(
    target: Any = None,
    example_inputs: Any = None,
    *,
    ops: Sequence[Any] | None = None,
    train: bool = True,
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    modes: Sequence[str] = ("fwd", "bwd"),
    jobs: int | None = None,
) -> WarmupReport:
    """Compile, in parallel, every Triton kernel the given calls will launch, without running
    them; their real first calls then load the kernels (from this process, or from Triton's
    disk cache in a later one) instead of compiling them one after another.

    Args:
        target: a ``torch.nn.Module`` (called on ``example_inputs``), or a function of no
            arguments that makes the calls (a training step, say), or None with ``ops``.
        example_inputs: the module's inputs: a tensor, a tuple of positional arguments or a
            dict of keyword arguments, on the device and with the shapes of the real run.
        ops: operators (names ``tritonkit list`` shows: their bench shapes and dtypes) or
            ``(name, shape, dtype)`` tuples, called as ``tritonkit bench`` calls them.
        train: with a module, also warm its backward (of ``loss_fn(output)``) and, with
            ``optimizer``, one optimizer step.
        optimizer: the optimizer of the run; a fresh one of its class over its parameter
            groups steps here, so its state is not touched.
        loss_fn: ``output -> scalar`` for the backward; default: ``output.loss`` when the
            output has one, else the sum of its (first) tensor.
        modes: with ``ops``, the bench modes to warm ("fwd", "bwd").
        jobs: threads compiling (default: the CPU cores, at most 32).

    Returns:
        A ``WarmupReport``: the specializations recorded (``records``), how many were
        compiled, and what failed.

    The calls run with nothing launched: their outputs hold no values, and nothing the calls
    can reach is changed (see the module's docstring). Make the calls exactly as the run will
    (same shapes, dtypes, devices, train or eval mode): a specialization the run meets that
    the warmup did not is compiled on its first call, as without warmup.
    """
    if ops is None and target is None:
        raise TypeError("tritonkit.warmup: give a module, a function of no arguments, or ops=")
    if ops is not None and target is not None:
        raise TypeError("tritonkit.warmup: give either target or ops=, not both")
    if isinstance(target, torch.nn.Module):
        if example_inputs is None:
            raise TypeError("tritonkit.warmup: a module needs example_inputs")
    elif target is not None and not callable(target):
        raise TypeError(
            "tritonkit.warmup: target must be a torch.nn.Module or a function of no arguments, "
            f"got {type(target).__name__}"
        )
    if optimizer is not None and not isinstance(target, torch.nn.Module):
        raise TypeError("tritonkit.warmup: optimizer= goes with a module target")
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"tritonkit.warmup: jobs must be an integer >= 1, got {jobs!r}")
    cases = _op_cases(ops) if ops is not None else []
    report = WarmupReport()
    with recording(report, jobs):
        if isinstance(target, torch.nn.Module):
            _call_module(target, example_inputs, train, optimizer, loss_fn, report)
        elif target is not None:
            _attempt(report, getattr(target, "__name__", "target"), target)
        for spec, shape, dtype in cases:
            _attempt(report, f"{spec.name} {shape} {dtype}",
                     lambda s=spec, sh=shape, d=dtype: _call_spec(s, sh, d, modes))  # fmt: skip
    return report


def _call_spec(spec: Any, shape: Any, dtype: torch.dtype, modes: Sequence[str]) -> None:
    from tritonkit.harness.warm import _call_candidates

    _call_candidates(spec, shape, dtype, tuple(modes), baselines=(), variants=False, seed=0)


# ---- compiling records elsewhere ----------------------------------------------------------------


def _jit_function(record: dict) -> Any:
    obj: Any = importlib.import_module(record["module"])
    for part in record["qualname"].split("."):
        obj = getattr(obj, part)
    return obj.fn if isinstance(obj, _launch.Kernel) else obj


def compile_record(record: dict, target: Any = None) -> Any:
    """Compile one record of ``WarmupReport.records`` into Triton's cache: for ``target`` (a
    ``triton.backends.compiler.GPUTarget``; compiling needs no GPU) or, without one, for the
    current GPU (``JITFunction.preload``, its C launcher too). Returns the compiled kernel."""
    jit = _jit_function(record)
    if target is None:
        return _compile_here(jit, record, torch.cuda.current_device())
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource, make_backend

    # As JITFunction.preload reads the record, with the target given instead of the GPU's.
    obj = json.loads(record["spec"])
    if obj["name"] != jit._fn_name:
        raise RuntimeError(f"record for {obj['name']} resolves to {jit._fn_name}")

    def constant(value: Any) -> Any:
        if tl.dtype.is_dtype(value):
            return tl.dtype(value)
        if isinstance(value, dict) and "constexpr" in value:
            return tl.constexpr(value["constexpr"])
        return value

    constexprs = {tuple(k): constant(v) for k, v in zip(obj["constant_keys"], obj["constant_vals"])}
    attrs = dict(zip(map(tuple, obj["attrs_keys"]), obj["attrs_vals"]))
    signature = {k: _tuples(v) for k, v in obj["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in obj["options"].items()}
    options = make_backend(target).parse_options(options)
    src = ASTSource(jit, signature, constexprs, attrs)
    return triton.compile(src, target=target, options=options.__dict__)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def compile_records(
    records: Sequence[dict], target: Any = None, jobs: int | None = None
) -> WarmupReport:
    """Compile records (``WarmupReport.records``, or their JSON) on ``jobs`` threads; see
    ``compile_record``."""
    report = WarmupReport(records=list(records), jobs=jobs or default_jobs())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(report.jobs, "tritonkit-warmup") as pool:
        futures = [pool.submit(compile_record, r, target) for r in records]
        for r, f in zip(records, futures):
            try:
                f.result()
                report.compiled += 1
            except Exception as exc:
                report.failed.append(f"{r['qualname']}: {type(exc).__name__}: {exc}"[:300])
    report.compile_s = time.perf_counter() - t0
    return report
