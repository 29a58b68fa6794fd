"""Kernel metrics: registers, spills, shared memory, theoretical occupancy; without a GPU too.

On a GPU (``gpu_metrics``): one call of the operator through Triton's own launcher records
each compiled kernel it launches, whose driver attributes give the registers and local memory
(spills) and whose metadata the shared memory and warps: no compile, no child process.

Without a GPU (``static_metrics``, below):

An operator is called on CPU tensors with every kernel launch replaced by a recorder
(``Kernel._launch`` in ops/_core/launch.py, which every ``@kernel`` launch goes through, and
``JITFunction.run`` for a plain ``triton.jit`` one; nothing runs). The ops answer their device
queries as on an H100 (132 SMs, 227 KiB of shared memory per block, TMA, CUDA tensors), so
they choose the configs they would there; each distinct launch is specialized by Triton's own
binder for the CUDA backend and compiled for ``GPUTarget("cuda", 90, 32)`` (sm_90a) with the
ptxas Triton ships, whose ``-v`` report gives registers and spill bytes; the shared memory is
the compiled kernel's. Autotuning is off (each kernel's heuristic default): a GPU whose tuning
cache holds other tiles launches those.

Theoretical occupancy on sm_90: resident warps per SM over its 64, with the programs per SM
the least of 32, 64 / warps, 65536 registers / (warps x the registers a warp takes, in units
of 256), and 228 KiB of shared memory / (the program's + 1 KiB the driver reserves per block).

Triton decides at decoration time whether a kernel runs under the interpreter, so the
recording and compiling run in a fresh process with TRITON_INTERPRET unset (``static_metrics``
starts it): ``python -m tritonkit.harness.kernel_stats OP [--shape S] [--dtype D] [--mode M]``
prints JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tritonkit.harness.modes import _mode_callable

# H100 (and H200): SMs, shared memory per block (opt-in) and per SM, registers and warps per SM.
H100_SMS = 132
H100_SMEM = 232448
SM90_SMEM_PER_SM = 233472
SM90_SMEM_RESERVED = 1024
SM90_REGS = 65536
SM90_WARPS = 64
SM90_BLOCKS = 32


def occupancy_sm90(num_warps: int, registers: int, shared: int) -> dict[str, Any]:
    """Programs per SM and theoretical occupancy (resident warps / 64) on sm_90, and the limit.

    Args:
        num_warps: warps per program.
        registers: registers per thread (ptxas).
        shared: bytes of shared memory per program.
    """
    warp_regs = math.ceil(max(registers, 1) * 32 / 256) * 256
    limits = {
        "blocks": SM90_BLOCKS,
        "warps": SM90_WARPS // num_warps,
        "registers": SM90_REGS // (num_warps * warp_regs),
        "shared memory": SM90_SMEM_PER_SM // (shared + SM90_SMEM_RESERVED),
    }
    programs = min(limits.values())
    limit = min(limits, key=lambda k: limits[k])
    return {
        "programs_per_sm": programs,
        "occupancy": programs * num_warps / SM90_WARPS,
        "occupancy_limit": limit,
    }


def _ptxas() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_log(kernel: Any) -> str:
    """ptxas -v's report on a compiled kernel's PTX (registers, spills, shared memory)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(kernel.asm["ptx"])
        argv = [_ptxas(), "-v", "--gpu-name", "sm_90a", path, "-o", os.path.join(d, "k.cubin")]
        # Twice at most: on a GPU machine running the suite's 14 workers, ptxas once exited
        # 255 on a kernel it compiles alone (a transient failure); its message is kept.
        for _attempt in range(2):
            out = subprocess.run(argv, capture_output=True, text=True)
            if out.returncode == 0:
                return out.stderr
        raise RuntimeError(
            f"ptxas exited {out.returncode} twice: {(out.stderr or out.stdout).strip()[-500:]}"
        )


def ptxas_stats(kernel: Any) -> dict[str, int]:
    """registers, spill_stores, spill_loads (bytes) and smem (bytes, static) from ptxas -v."""
    log = ptxas_log(kernel)

    def number(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
        "smem": number(r"(\d+) bytes smem"),
    }


def kernel_metrics(kernel: Any, num_warps: int) -> dict[str, Any]:
    """ptxas's figures, the compiled kernel's shared memory and the occupancy they allow."""
    stats = ptxas_stats(kernel)
    shared = int(getattr(kernel.metadata, "shared", 0) or 0)
    return {
        "registers": stats["registers"],
        "spill_stores": stats["spill_stores"],
        "spill_loads": stats["spill_loads"],
        "shared": shared,
        "num_warps": num_warps,
        **occupancy_sm90(num_warps, stats["registers"], shared),
    }


# ---- recording launches (the child process) -------------------------------------------------

# Modules whose ``interpreter_enabled`` only decides whether a CPU tensor is accepted: there it
# answers True, everywhere else False (the GPU's code paths and configs).
_DEVICE_CHECKS = (
    "tritonkit.ops._core.validate",
    "tritonkit.optim._base",
    "tritonkit.ops.attention.validate",
)


def _rebind(name: str, original: Any, replacement: Any, saved: list) -> None:
    """Replace ``original``, bound as ``name`` in any tritonkit module, by ``replacement``."""
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith("tritonkit") and getattr(mod, name, None) is original:
            saved.append((mod, name, original))
            setattr(mod, name, replacement)


@contextmanager
def as_on_gpu(sms: int = H100_SMS, smem: int = H100_SMEM) -> Iterator[None]:
    """The ops' device queries answered as on a GPU of ``sms`` SMs and ``smem`` bytes of shared
    memory per block, with CPU tensors accepted by the device checks."""
    import importlib

    import torch

    from tritonkit.ops._core import device as _device

    matmul_plan = importlib.import_module("tritonkit.ops.matmul.plan")
    saved: list = []
    _rebind("sm_count", _device.sm_count, lambda device: sms, saved)
    _rebind("shared_memory_per_block", _device.shared_memory_per_block, lambda d: smem, saved)
    _rebind("tma_device", matmul_plan.tma_device, lambda device, options=None: True, saved)
    for mod_name in _DEVICE_CHECKS:
        mod = sys.modules.get(mod_name) or importlib.import_module(mod_name)
        saved.append((mod, "interpreter_enabled", mod.interpreter_enabled))
        mod.interpreter_enabled = lambda: True
    torch.Tensor.is_cuda = property(lambda self: True)
    try:
        yield
    finally:
        del torch.Tensor.is_cuda  # torch._C.TensorBase's again
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


class Launch:
    """One launch as the CUDA backend specializes it: what ``triton.compile`` takes."""

    def __init__(self, fn: Any, args: tuple, meta: dict, binders: dict) -> None:
        from triton import knobs
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        backend = make_backend(target())
        binder = binders.get(fn)
        if binder is None:
            binder = binders[fn] = create_function_from_signature(fn.signature, fn.params, backend)
        kwargs = dict(meta)
        # As JITFunction.run adds them.
        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(
            backend, kwargs, bound, specialization, options
        )
        self.fn, self.signature, self.constexprs, self.attrs = fn, signature, constexprs, attrs
        self.options = options.__dict__
        self.extra = {k: v for k, v in meta.items() if k not in fn.arg_names}
        self.extra.pop("num_warps", None)
        self.extra.pop("num_stages", None)

    def key(self) -> str:
        """Kernel | arguments (type, /16 where divisible by 16) | constexprs | warps, stages and
        any other launch option given."""
        aligned = {path[0] for path, a in self.attrs.items() if ["tt.divisibility", 16] in a}
        args = []
        for i, (name, ty) in enumerate(self.signature.items()):
            if ty != "constexpr":
                args.append(f"{name}:{ty}{'/16' if i in aligned else ''}")
        consts = []
        for path, value in sorted(self.constexprs.items()):
            value = getattr(value, "value", value)
            consts.append(f"{self.fn.arg_names[path[0]]}={value!r}")
        opts = f"w{self.options['num_warps']} s{self.options['num_stages']}"
        opts += "".join(f" {k}={v!r}" for k, v in sorted(self.extra.items()))
        return f"{self.fn.__name__} | {' '.join(args)} | {' '.join(consts)} | {opts}"

    def compile(self) -> Any:
        import triton
        from triton.compiler import ASTSource

        src = ASTSource(
            fn=self.fn, signature=self.signature, constexprs=self.constexprs, attrs=self.attrs
        )
        return triton.compile(src, target=target(), options=self.options)


def target() -> Any:
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


@contextmanager
def recording(on_launch: Any) -> Iterator[None]:
    """Every kernel launch calls ``on_launch(fn, args, meta, grid)`` instead of launching."""
    from triton.runtime.jit import JITFunction

    from tritonkit.ops._core import launch as _launch

    real_launch, real_run = _launch.Kernel._launch, JITFunction.run

    def fake_launch(self, grid, args, meta):
        on_launch(self.fn, args, meta, grid)
        return None, None  # no entry: a Bound launch keeps calling _launch

    def fake_run(self, *args, grid, warmup, **meta):  # a plain triton.jit launch, if any
        if warmup:
            raise RuntimeError(f"{self.__name__}: warmup (a compile for this machine) asked")
        on_launch(self, args, meta, grid)

    _launch.Kernel._launch = fake_launch
    JITFunction.run = fake_run
    try:
        yield
    finally:
        _launch.Kernel._launch, JITFunction.run = real_launch, real_run


def _programs(grid: Any, meta: dict) -> int | None:
    try:
        g = grid(meta) if callable(grid) else grid
        return int(math.prod(int(x) for x in g))
    except Exception:  # a grid that needs the compiled kernel's metadata: left out
        return None


def record_launches(spec: Any, shape: Any, dtype: Any, mode: str) -> list[tuple[Launch, Any]]:
    """The distinct launches (with their grids) of one case of ``spec``, in launch order."""
    import torch

    launches: dict[str, tuple[Launch, Any]] = {}
    binders: dict = {}

    def on_launch(fn, args, meta, grid):
        launch = Launch(fn, args, meta, binders)
        launches.setdefault(launch.key(), (launch, _programs(grid, meta)))

    params = dict(spec.params[0])
    inputs = spec.make_inputs(shape, dtype, torch.device("cpu"), 0)
    grad_idx = spec.grad_indices(inputs) if mode != "fwd" else []
    with as_on_gpu(), recording(on_launch):
        _mode_callable(spec.impl, inputs, params, mode, grad_idx, 0)()
    return list(launches.values())


def case_metrics(op: str, shape: Any = None, dtype: str | None = None, mode: str = "fwd") -> dict:
    """Per kernel of one case (in this process, which must not interpret): name, programs,
    warps, stages, registers, spills, shared memory, programs per SM, occupancy and its limit."""
    from tritonkit.harness.selection import main_dtype
    from tritonkit.harness.spec import dtype_name, get_spec, parse_dtype

    spec = get_spec(op)
    dt = parse_dtype(dtype) if dtype else main_dtype(spec)
    shape = shape if shape is not None else spec.shapes.bench[0]
    out: dict[str, Any] = {"op": op, "shape": str(shape), "dtype": dtype_name(dt), "mode": mode}
    kernels = []
    for launch, programs in record_launches(spec, shape, dt, mode):
        entry: dict[str, Any] = {
            "name": launch.fn.__name__,
            "programs": programs,
            "num_stages": launch.options["num_stages"],
        }
        try:
            entry.update(kernel_metrics(launch.compile(), launch.options["num_warps"]))
            if programs is not None:
                slots = entry["programs_per_sm"] * H100_SMS
                entry["waves"] = programs / slots if slots else None
        except Exception as exc:  # one kernel that fails to compile must not hide the rest
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        kernels.append(entry)
    out["kernels"] = kernels
    out["source"] = "ptxas -v, sm_90a (static: compiled without a GPU)"
    return out


# ---- on a GPU: the kernels a call launched, as compiled for this device -----------------------


@contextmanager
def through_triton(found: dict[int, tuple[Any, Any]]) -> Iterator[None]:
    """Every launch inside takes Triton's own launcher, and ``found`` receives each compiled
    kernel launched (by id: the kernel and the launch's grid). A no-op launch hook sends the
    direct and bound launch paths to Triton's (they step aside for hooks), and the C++ replay
    of a recorded call is off (it launches without Python)."""
    import triton
    from triton.runtime.jit import JITFunction

    from tritonkit.ops._core import launch as _launch
    from tritonkit.ops._core import registry

    real_run = JITFunction.run

    def run(self, *args, grid, warmup, **meta):
        kernel = real_run(self, *args, grid=grid, warmup=warmup, **meta)
        if not warmup and kernel is not None:
            bound = dict(zip(self.arg_names, args, strict=False)) | meta
            found.setdefault(id(kernel), (kernel, _programs(grid, bound)))
        return kernel

    def hook(*args: Any) -> None:
        return None

    chain = triton.knobs.runtime.launch_enter_hook
    replay = registry._REPLAY
    JITFunction.run = run
    chain.add(hook)
    registry._REPLAY = False
    try:
        yield
        _launch.flush()  # launches deferred by launch.pipelined go now, through the patch
    finally:
        JITFunction.run = real_run
        chain.remove(hook)
        registry._REPLAY = replay


def compiled_metrics(kernel: Any, programs: int | None = None) -> dict[str, Any]:
    """Registers, local memory (spills and stack: the driver's figure, bytes per thread),
    shared memory, warps and stages of a kernel as compiled and loaded on this GPU, and the
    occupancy they allow on sm_90 (the H100's and H200's limits)."""
    kernel._init_handles()  # loads the module: n_regs and n_spills come from the driver
    md = kernel.metadata
    registers, shared = int(kernel.n_regs), int(getattr(md, "shared", 0) or 0)
    warps = int(md.num_warps)
    entry: dict[str, Any] = {
        "name": kernel.name,
        "programs": programs,
        "num_stages": getattr(md, "num_stages", None),
        "registers": registers,
        "local_bytes": 4 * int(kernel.n_spills),  # the driver's local size, in bytes
        "shared": shared,
        "num_warps": warps,
        **occupancy_sm90(warps, registers, shared),
    }
    if programs is not None:
        slots = entry["programs_per_sm"] * H100_SMS
        entry["waves"] = programs / slots if slots else None
    return entry


def gpu_metrics(call: Any, setup: Any = None) -> dict[str, Any]:
    """Per kernel one call of ``call`` launches on this GPU, from the compiled kernels
    themselves (no compile, no child process): name, programs, registers, local memory,
    shared memory, warps, stages and theoretical occupancy. ``setup`` runs first (an
    in-place operator's inputs put back)."""
    import torch

    found: dict[int, tuple[Any, Any]] = {}
    if setup is not None:
        setup()
    with through_triton(found):
        call()
    torch.cuda.synchronize()
    kernels = []
    for kernel, programs in found.values():
        try:
            kernels.append(compiled_metrics(kernel, programs))
        except Exception as exc:  # one kernel's figures must not hide the rest
            name = getattr(kernel, "name", "?")
            kernels.append({"name": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return {
        "kernels": kernels,
        "source": "the compiled kernels on this GPU (CUDA driver attributes)",
    }


# The CPU path's results by case: a run that asks twice (bench's modes, profile after bench)
# compiles once.
_STATIC_CACHE: dict[tuple, dict[str, Any]] = {}
STATIC_TIMEOUT_S = 180.0  # one case's child process, at most


def static_metrics(
    op: str,
    shape: Any = None,
    dtype: str | None = None,
    mode: str = "fwd",
    timeout_s: float = STATIC_TIMEOUT_S,
) -> dict[str, Any]:
    """``case_metrics`` of one case, run in a fresh process with TRITON_INTERPRET unset (the
    kernels must be decorated for compiling, not interpreting); its JSON, or ``error`` (a
    child that runs past ``timeout_s`` is killed and said so). Cached per case in this process.
    """
    key = (op, repr(shape), dtype, mode)
    if key not in _STATIC_CACHE:
        _STATIC_CACHE[key] = _static_child(op, shape, dtype, mode, timeout_s)
    return _STATIC_CACHE[key]


def _static_child(op: str, shape: Any, dtype: str | None, mode: str, timeout_s: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITONKIT_AUTOTUNE"] = "0"  # nothing can be timed: each kernel's default config
    # The child answers as an H100 with CPU tensors: a GPU it could see would take some paths
    # (streams, capabilities) to the real device with those CPU tensors.
    env["CUDA_VISIBLE_DEVICES"] = ""
    argv = [sys.executable, "-m", "tritonkit.harness.kernel_stats", op, "--mode", mode]
    if shape is not None:
        argv += ["--shape", repr(shape)]
    if dtype:
        argv += ["--dtype", dtype]
    try:
        run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"op": op, "kernels": [], "error": f"compiling for sm_90 took over {timeout_s:g} s"}
    if run.returncode != 0:
        return {"op": op, "kernels": [], "error": run.stderr.strip()[-1500:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def selection_metrics(timeout_s: float = 3600.0) -> list[dict[str, Any]]:
    """``case_metrics`` of every operator of the main job's selection (its main dtype, its first
    bench shape, forward; distributed specs left out), in one fresh process: one entry per
    operator, with ``error`` where its case could not be recorded."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITONKIT_AUTOTUNE="0", CUDA_VISIBLE_DEVICES="")
    argv = [sys.executable, "-m", "tritonkit.harness.kernel_stats", "--all"]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0:
        rows.append({"op": "?", "kernels": [], "error": run.stderr.strip()[-1500:]})
    return rows


def _all() -> None:
    from tritonkit.harness.spec import select

    for spec in select(None):
        if spec.distributed is not None:
            continue
        try:
            got = case_metrics(spec.name)
        except Exception as exc:  # one operator that cannot be recorded must not hide the rest
            got = {"op": spec.name, "kernels": [], "error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps(got), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("op", nargs="?")
    p.add_argument("--all", action="store_true", help="every operator of the main selection")
    p.add_argument("--shape", default=None, help="a Python literal; default: first bench shape")
    p.add_argument("--dtype", default=None, help="default: the operator's main dtype")
    p.add_argument("--mode", default="fwd", choices=("fwd", "bwd", "fwd+bwd"))
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("kernel_stats: TRITON_INTERPRET=1 is set; unset it (static_metrics does)")
    if args.all:
        _all()
        return
    if args.op is None:
        p.error("an operator, or --all")
    import ast

    shape = ast.literal_eval(args.shape) if args.shape else None
    print(json.dumps(case_metrics(args.op, shape, args.dtype, args.mode)))


if __name__ == "__main__":
    main()
