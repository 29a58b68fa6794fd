"""The first hour's cold start (issues 38, 43): ten operators called three times each in a
fresh process at training shapes, from empty caches, then again with the caches warm, and
after ``tritonkit.warmup`` compiled their kernels.

    python experiments/gpu_coldstart.py --out DIR          # GPU: about 3-5 minutes
    python experiments/gpu_coldstart.py --out DIR --tiny   # CPU interpreter, tiny shapes
    python experiments/gpu_coldstart.py --out DIR --scenarios cold,after_warmup

Each scenario is a fresh Python process (``--child``) with its own TRITON_CACHE_DIR and
TRITONKIT_CACHE_DIR:

- ``cold``: both caches empty (new temporary directories);
- ``warm``: the same directories again, now filled by ``cold`` (and before it, a process of
  its own times the phases of a first call without a profiler: imports, the torch.library
  registrations, rms_norm's first forward and backward);
- ``cold_no_autotune``: empty caches with TRITONKIT_AUTOTUNE=0 (never time a config);
- ``cold_no_early``: empty caches with TRITONKIT_EARLY_LAUNCH=0 (each new specialization
  waits for its C launcher's build, as before the early launch);
- ``after_warmup``: empty caches, then a process that runs ``tritonkit.warmup`` over the
  ten operators' calls (its own time reported: ``warmup_process_s``, and the warmup's
  ``record_s`` and ``compile_s``), then the measured process with those caches.

In each, every operator is called three times; each call's wall time is measured with the
device synchronized before and after (compilation, tuning, replay recording and the GPU work
all count, as a user's first steps meet them). Forward and backward where the operator has
one. The acceptance of issue 38: cold <= 12 s for the thirty calls with no call > 3 s, warm
<= 1.5 s, no second call > 100 ms.

Writes DIR/coldstart.json (every call, the environment), DIR/coldstart.md (tables) and
DIR/coldstart.png (each call's time per scenario) when matplotlib is there.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("cold", "warm", "cold_no_autotune", "cold_no_early", "after_warmup")


# ---- the child: ten operators, three calls each ------------------------------------------------


def _ops(tiny: bool):
    """(name, make) pairs; make() returns a callable running one call (fwd, or fwd+bwd)."""
    import torch

    import tritonkit as tk

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    bf16 = torch.bfloat16 if cuda else torch.float32  # the interpreter: no bf16 dots
    rows, cols = (8192, 4096) if not tiny else (64, 96)
    mm = (8192, 4096, 11008) if not tiny else (64, 32, 48)
    ce = (4096, 32000) if not tiny else (32, 100)
    att = (2, 16, 2048, 128) if not tiny else (1, 2, 64, 32)
    opt_n = 4096 if not tiny else 32
    f8 = 4096 if not tiny else 32

    def rand(*shape, dtype=bf16, grad=True):
        return torch.randn(*shape, device=dev, dtype=dtype).requires_grad_(grad)

    def fwd_bwd(fn, *inputs):
        def call():
            out = fn(*inputs)
            out = out[0] if isinstance(out, tuple) else out
            out.float().sum().backward()

        return call

    def rms_norm():
        x, w = rand(rows, cols), rand(cols)
        return fwd_bwd(lambda a, b: tk.rms_norm(a, (cols,), b), x, w)

    def softmax():
        return fwd_bwd(lambda a: tk.softmax(a, dim=-1), rand(rows, cols))

    def gelu():
        return fwd_bwd(tk.gelu, rand(rows, cols))

    def matmul():
        a, b = rand(mm[0], mm[1], grad=False), rand(mm[1], mm[2], grad=False)
        return lambda: tk.matmul(a, b)

    def linear_gelu():
        x = rand(mm[0], mm[1])
        w = (torch.randn(mm[2], mm[1], device=dev, dtype=bf16) / 64).requires_grad_()
        b = rand(mm[2])
        return fwd_bwd(lambda x_, w_, b_: tk.linear(x_, w_, b_, activation="gelu_tanh"), x, w, b)

    def cross_entropy():
        logits = rand(*ce)
        target = torch.randint(0, ce[1], (ce[0],), device=dev)
        return fwd_bwd(lambda z: tk.cross_entropy(z, target), logits)

    def attention():
        q, k, v = (rand(*att) for _ in range(3))
        return fwd_bwd(lambda a, b, c: tk.attention(a, b, c, is_causal=True), q, k, v)

    def _params():
        ps = [torch.nn.Parameter(torch.randn(opt_n, opt_n, device=dev)) for _ in range(4)]
        for p in ps:
            p.grad = torch.randn_like(p)
        return ps

    def adamw():
        opt = tk.optim.AdamW(_params(), lr=1e-3)
        return opt.step

    def muon():
        opt = tk.optim.Muon(_params(), lr=1e-3)
        return opt.step

    def float8_linear():
        m = tk.nn.Float8Linear(f8, f8, device=dev, dtype=bf16)
        x = rand(f8, f8)
        return fwd_bwd(m, x)

    return [
        ("rms_norm", rms_norm),
        ("softmax", softmax),
        ("gelu", gelu),
        ("matmul", matmul),
        ("linear_gelu_tanh", linear_gelu),
        ("cross_entropy", cross_entropy),
        ("attention_causal", attention),
        ("adamw", adamw),
        ("muon", muon),
        ("float8_linear", float8_linear),
    ]


def child_warmup(tiny: bool) -> dict:
    """``tritonkit.warmup`` over one call of each operator (what ``child`` then calls)."""
    t_start = time.perf_counter()
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import tritonkit

    calls = [make() for _, make in _ops(tiny)]

    def all_calls():
        for call in calls:
            call()

    report = tritonkit.warmup(all_calls)
    return {
        "warmup_process_s": time.perf_counter() - t_start,
        "record_s": report.record_s,
        "compile_s": report.compile_s,
        "kernels": report.kernels,
        "compiled": report.compiled,
        "jobs": report.jobs,
        "failed": report.failed[:10],
        "errors": report.errors[:10],
    }


def child_breakdown(tiny: bool) -> dict:
    """Wall time of a warm process's first-call phases, without a profiler (which inflates
    the many small Python calls of imports and registrations): importing torch, triton and
    tritonkit's families (and within that, the torch.library registrations), then rms_norm's
    first forward and backward."""
    t = {"start": time.perf_counter()}
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    t["torch"] = time.perf_counter()
    import triton  # noqa: F401

    t["triton"] = time.perf_counter()
    from tritonkit.ops._core import registry

    spent = {"op_define_s": 0.0, "register_fake_s": 0.0, "ops": 0}
    init, fake = registry.Op.__init__, registry.Op.register_fake

    def timed_init(self, *args):
        t0 = time.perf_counter()
        init(self, *args)
        spent["op_define_s"] += time.perf_counter() - t0
        spent["ops"] += 1

    def timed_fake(self, fn):
        t0 = time.perf_counter()
        try:
            return fake(self, fn)
        finally:
            spent["register_fake_s"] += time.perf_counter() - t0

    registry.Op.__init__, registry.Op.register_fake = timed_init, timed_fake
    import tritonkit.functional as tkf  # the families' import, timed

    t["families"] = time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows, cols = (8192, 4096) if not tiny else (64, 96)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    x = torch.randn(rows, cols, device=dev, dtype=dtype, requires_grad=True)
    w = torch.randn(cols, device=dev, dtype=dtype, requires_grad=True)

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    sync()
    t["inputs"] = time.perf_counter()
    y = tkf.rms_norm(x, (cols,), w)
    sync()
    t["forward"] = time.perf_counter()
    y.float().sum().backward()
    sync()
    t["backward"] = time.perf_counter()
    names = list(t)
    phases = {f"{b}_s": t[b] - t[a] for a, b in itertools.pairwise(names)}
    return {"phases": phases, **spent}


def child(tiny: bool) -> dict:
    t_start = time.perf_counter()
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    imported = time.perf_counter() - t_start
    results = []
    for name, make in _ops(tiny):
        rec = {"op": name, "calls_s": [], "error": None}
        try:
            call = make()
            sync()
            for _ in range(3):
                t0 = time.perf_counter()
                call()
                sync()
                rec["calls_s"].append(time.perf_counter() - t0)
        except Exception as exc:  # one operator's failure is recorded; the others run
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        results.append(rec)
    return {"import_s": imported, "process_s": time.perf_counter() - t_start, "ops": results}


# ---- the parent: scenarios in fresh processes ---------------------------------------------------


def fingerprint() -> dict:
    import torch
    import triton

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "git_commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def _run_child(flag: str, env: dict, tiny: bool) -> tuple[dict | None, str | None, float]:
    args = [sys.executable, __file__, flag] + (["--tiny"] if tiny else [])
    t0 = time.perf_counter()
    try:
        p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "timeout after 900 s", time.perf_counter() - t0
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {p.stderr[-2000:]}", wall
    return json.loads(p.stdout.strip().splitlines()[-1]), None, wall


def run_scenario(name: str, dirs: dict, tiny: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **dirs}
    env.pop("TRITONKIT_AUTOTUNE", None)
    env.pop("TRITONKIT_EARLY_LAUNCH", None)
    if name == "cold_no_autotune":
        env["TRITONKIT_AUTOTUNE"] = "0"
    if name == "cold_no_early":
        env["TRITONKIT_EARLY_LAUNCH"] = "0"
    warmup = None
    if name == "after_warmup":
        warmup, error, wall = _run_child("--child-warmup", env, tiny)
        if error is not None:
            return {"scenario": name, "error": f"warmup: {error}"}
        warmup["wall_s"] = wall
    breakdown = None
    if name == "warm":  # first, a process of its own: the phases of its first call
        breakdown, error, _ = _run_child("--child-breakdown", env, tiny)
        if error is not None:
            breakdown = {"error": error}
    doc, error, wall = _run_child("--child", env, tiny)
    if error is not None:
        return {"scenario": name, "error": error}
    doc.update(scenario=name, wall_s=wall)
    if warmup is not None:
        doc["warmup"] = warmup
    if breakdown is not None:
        doc["breakdown"] = breakdown
    return doc


def summarize(doc: dict) -> dict:
    calls = [c for op in doc.get("ops", []) for c in op["calls_s"]]
    seconds = [op["calls_s"][1] for op in doc.get("ops", []) if len(op["calls_s"]) > 1]
    out = {
        "total_calls_s": sum(calls),
        "max_call_s": max(calls, default=None),
        "max_second_call_s": max(seconds, default=None),
        "errors": [op["op"] for op in doc.get("ops", []) if op["error"]],
    }
    if "error" in doc:
        out["error"] = doc["error"][:300]
    if "warmup" in doc:
        w = doc["warmup"]
        out["warmup"] = {k: w.get(k) for k in ("warmup_process_s", "record_s", "compile_s",
                                              "kernels", "compiled", "jobs")}  # fmt: skip
    return out


def table(docs: list[dict]) -> str:
    names = [op["op"] for op in next((d["ops"] for d in docs if "ops" in d), [])]
    head = "| op | " + " | ".join(f"{d['scenario']} (1st / 2nd / 3rd, s)" for d in docs) + " |"
    lines = [head, "|---" * (len(docs) + 1) + "|"]
    for i, name in enumerate(names):
        cells = []
        for d in docs:
            op = d["ops"][i] if "ops" in d else None
            if op is None or op["error"]:
                cells.append(f"error: {op['error'][:60]}" if op else "—")
            else:
                cells.append(" / ".join(f"{c:.3f}" for c in op["calls_s"]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    sums = [summarize(d) for d in docs]
    lines.append(
        "| **all 30 calls** | "
        + " | ".join(
            f"{s['total_calls_s']:.2f} (max {s['max_call_s'] or 0:.2f}, max 2nd "
            f"{s['max_second_call_s'] or 0:.3f})"
            for s in sums
        )
        + " |"
    )
    for d in docs:
        if "warmup" in d:
            w = d["warmup"]
            lines.append(
                f"\n{d['scenario']}: the warmup process took {w['warmup_process_s']:.2f} s "
                f"(recording {w['record_s']:.2f} s, compiling {w['kernels']} kernels "
                f"{w['compile_s']:.2f} s on {w['jobs']} threads, {len(w['failed'])} failed, "
                f"{len(w['errors'])} calls raised)"
            )
        if "error" in d:
            lines.append(f"\n{d['scenario']}: {d['error'][:300]}")
        if "breakdown" in d and "phases" in d["breakdown"]:
            b = d["breakdown"]
            phases = ", ".join(f"{k[:-2]} {v:.3f}" for k, v in b["phases"].items())
            lines.append(
                f"\n{d['scenario']}, a process of its own (s): {phases}; of the families' "
                f"import, {b['ops']} torch.library ops defined in {b['op_define_s']:.3f} and "
                f"their fakes registered in {b['register_fake_s']:.3f}"
            )
    return "\n".join(lines)


def plot(docs: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    docs = [d for d in docs if "ops" in d]
    names = [op["op"] for op in docs[0]["ops"]]
    fig, axes = plt.subplots(1, len(docs), figsize=(5 * len(docs), 4.5), sharey=True)
    for ax, d in zip(axes if len(docs) > 1 else [axes], docs):
        for k in range(3):
            ys = [op["calls_s"][k] if len(op["calls_s"]) > k else 0 for op in d["ops"]]
            ax.barh([i + 0.27 * (k - 1) for i in range(len(names))], ys, height=0.27,
                    label=f"call {k + 1}")  # fmt: skip
        ax.set_yticks(range(len(names)), names)
        ax.set_xscale("log")
        ax.set_xlabel("wall time per call, s (log)")
        ax.set_title(f"{d['scenario']}: {summarize(d)['total_calls_s']:.1f} s in all")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU interpreter)")
    ap.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-warmup", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-breakdown", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_breakdown:
        print(json.dumps(child_breakdown(args.tiny)))
        return
    if args.child:
        print(json.dumps(child(args.tiny)))
        return
    if args.child_warmup:
        print(json.dumps(child_warmup(args.tiny)))
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="coldstart-"))
    out.mkdir(parents=True, exist_ok=True)
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SCENARIOS]
    if unknown:
        ap.error(f"--scenarios: unknown {unknown}; known: {', '.join(SCENARIOS)}")
    docs = []
    # warm reuses cold's caches; every other scenario starts from empty ones.
    groups = [[s for s in ("cold", "warm") if s in wanted]]
    groups += [[s] for s in wanted if s not in ("cold", "warm")]
    for group in groups:
        if not group:
            continue
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            dirs = {"TRITON_CACHE_DIR": a, "TRITONKIT_CACHE_DIR": b}
            for name in group:
                docs.append(run_scenario(name, dirs, args.tiny))
                print(f"{name}: {summarize(docs[-1])}", file=sys.stderr)
    result = {
        "fingerprint": fingerprint(),
        "tiny": args.tiny,
        "scenarios": docs,
        "summary": {d["scenario"]: summarize(d) for d in docs},
    }
    (out / "coldstart.json").write_text(json.dumps(result, indent=1))
    md = table([d for d in docs])
    (out / "coldstart.md").write_text(
        f"# Cold start, ten operators x 3 calls\n\n{json.dumps(result['fingerprint'])}\n\n{md}\n"
    )
    plot(docs, out / "coldstart.png")
    print(md)


if __name__ == "__main__":
    main()
