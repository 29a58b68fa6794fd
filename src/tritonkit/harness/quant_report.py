"""``tritonkit quant-report``: what quantization costs a model (or a file of tensors).

For a model, every ``nn.Linear`` is looked at three ways (seed 001's error propagation):
the quantization of its input activation and of its weight (SQNR, clip ratio, error
percentiles, amax and scale statistics), its own output error when the quantized layer sees
the float model's input (local), and the error of its output in the fully quantized model
against the float model (propagated: what the layers before it add). The model's output SQNR
closes the table. A tensor file (``torch.save`` of a dict of tensors) gets the per-tensor
statistics.

Writes ``report.json``, ``report.md`` and ``sqnr.png`` / ``error.png`` into ``--out``, appends
the run to a trend file (the last 100 runs) and raises an alarm for every layer whose p99
absolute error exceeds ``--alarm-factor`` times its median over the earlier runs of the same
model and recipe (exit status 1 with ``--fail-on-alarm``).

This module imports no kernels at import time (the command line turns the CPU interpreter on
first).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

TREND_KEEP = 100
RECIPES = ("float8_tensorwise", "float8_rowwise", "int8_w8a8", "int8_weight_only")


def demo_mlp(seed: int = 0):
    """A small MLP on Gaussian inputs: (model, inputs) for a report without a model of one's own."""
    import torch
    from torch import nn

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 32)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    return model.to(device), torch.randn(96, 64, generator=g).to(device)


def _load_model(spec: str, seed: int):
    if spec == "demo-mlp":
        return demo_mlp(seed)
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"quant-report: --model must be 'package.module:factory', got {spec!r}")
    out = getattr(importlib.import_module(module), name)()
    if not (isinstance(out, tuple) and len(out) == 2):
        raise SystemExit(f"quant-report: {spec}() must return (model, inputs)")
    return out


def _activation_settings(recipe: str):
    """(dtype, granularity) the recipe casts a layer's input and its weight with."""
    import torch

    if recipe == "float8_tensorwise":
        return (torch.float8_e4m3fn, "tensor"), (torch.float8_e4m3fn, "tensor")
    if recipe == "float8_rowwise":
        return (torch.float8_e4m3fn, "row"), (torch.float8_e4m3fn, "row")
    if recipe == "int8_w8a8":
        return (torch.int8, "row"), (torch.int8, "row")
    return None, (torch.int8, "row")


def _stats(x, dtype, granularity) -> dict[str, float]:
    from tritonkit.quant import quantize
    from tritonkit.quant.metrics import error_stats

    x2 = x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x
    return error_stats(x2, quantize(x2.float(), dtype, granularity))


def _output_error(ref, out) -> dict[str, float]:
    import torch

    from tritonkit.quant.metrics import percentiles, sqnr_db

    err = (out.double() - ref.double()).abs().flatten()
    values = torch.cat([sqnr_db(ref, out).reshape(1), percentiles(err)]).tolist()
    return dict(zip(("sqnr_db", "p50_abs", "p90_abs", "p99_abs"), values))


def _capture(model, inputs, names) -> tuple[dict, dict, Any]:
    """Inputs and outputs of the named modules in one forward pass, and the model's output."""
    import torch

    ins: dict[str, Any] = {}
    outs: dict[str, Any] = {}
    hooks = []
    for name, mod in model.named_modules():
        if name in names:

            def hook(m, i, o, name=name):
                ins[name], outs[name] = i[0].detach(), o.detach()

            hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            y = model(inputs)
    finally:
        for h in hooks:
            h.remove()
    return ins, outs, y


def model_report(model, inputs, recipe: str) -> dict[str, Any]:
    """Per-layer and output statistics of ``recipe`` applied to ``model`` on ``inputs``."""
    from torch import nn

    from tritonkit.quant.model import RECIPES as CONVERT
    from tritonkit.quant.model import convert

    names = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    act, wgt = _activation_settings(recipe)
    ins, outs, y_ref = _capture(model, inputs, set(names))
    qmodel = convert(copy.deepcopy(model), recipe)
    qmods = dict(qmodel.named_modules())
    _, qouts, y_q = _capture(qmodel, inputs, set(names))
    _cls, _option = CONVERT[recipe]
    layers = []
    for name in names:
        x, w = ins[name], dict(model.named_modules())[name].weight.detach()
        row: dict[str, Any] = {"layer": name, "shape": list(w.shape)}
        if act is not None:
            row["activation"] = _stats(x, *act)
        row["weight"] = _stats(w, *wgt)
        import torch

        with torch.no_grad():
            local = qmods[name](x)
        row["local"] = _output_error(outs[name], local)
        row["propagated"] = _output_error(outs[name], qouts[name])
        layers.append(row)
    return {"layers": layers, "output": _output_error(y_ref, y_q)}


def tensors_report(path: str, recipe: str) -> dict[str, Any]:
    import torch

    act, wgt = _activation_settings(recipe)
    tensors = torch.load(path, map_location="cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(tensors, dict):
        raise SystemExit(f"quant-report: {path} must hold a dict of name -> tensor")
    dtype, gran = act or wgt
    rows = []
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            rows.append({"layer": name, "shape": list(t.shape), "weight": _stats(t, dtype, gran)})
    return {"layers": rows, "output": None}


def _alarms(doc: dict[str, Any], history: list[dict[str, Any]], factor: float) -> list[str]:
    """Layers whose p99 error exceeds ``factor`` x their median over earlier matching runs."""
    past = [r for r in history if r["source"] == doc["source"] and r["recipe"] == doc["recipe"]]
    alarms = []
    for name, p99 in doc["p99"].items():
        earlier = [r["p99"][name] for r in past if name in r["p99"]]
        if earlier and p99 > factor * statistics.median(earlier):
            alarms.append(
                f"{name}: p99 abs error {p99:.4g} > {factor:g} x median of {len(earlier)} "
                f"earlier runs ({statistics.median(earlier):.4g})"
            )
    return alarms


def _p99s(report: dict[str, Any]) -> dict[str, float]:
    out = {}
    for row in report["layers"]:
        part = row.get("propagated") or row["weight"]
        out[row["layer"]] = part["p99_abs"]
    return out


def _markdown(doc: dict[str, Any]) -> str:
    r = doc["report"]
    lines = [f"# Quantization report: {doc['source']}, recipe {doc['recipe']}", ""]
    lines.append(f"{doc['device']}, torch {doc['torch']}, {doc['date']}")
    lines.append("")
    head = "| layer | shape | act SQNR dB | act clip | weight SQNR dB | local SQNR dB | " \
           "propagated SQNR dB | propagated p50 / p90 / p99 |"  # fmt: skip
    lines += [head, "|" + " --- |" * 8]
    for row in r["layers"]:
        a = row.get("activation") or {}
        loc = row.get("local") or {}
        pr = row.get("propagated") or {}

        def f(d, k, fmt=".2f"):
            return format(d[k], fmt) if k in d else "-"

        pcts = " / ".join(f(pr, k, ".3g") for k in ("p50_abs", "p90_abs", "p99_abs")) if pr else "-"
        lines.append(
            f"| {row['layer']} | {tuple(row['shape'])} | {f(a, 'sqnr_db')} | "
            f"{f(a, 'clip_ratio', '.4f')} | {f(row['weight'], 'sqnr_db')} | {f(loc, 'sqnr_db')} | "
            f"{f(pr, 'sqnr_db')} | {pcts} |"
        )
    if r.get("output"):
        lines += ["", f"Model output: SQNR {r['output']['sqnr_db']:.2f} dB, p99 abs error "
                  f"{r['output']['p99_abs']:.4g}."]  # fmt: skip
    lines += ["", "## Alarms (p99 regression against earlier runs)", ""]
    lines += [f"- {a}" for a in doc["alarms"]] or ["none"]
    return "\n".join(lines) + "\n"


def _plots(doc: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["report"]["layers"]
    names = [r["layer"] for r in rows]
    x = range(len(rows))
    files = []
    fig, ax = plt.subplots(figsize=(max(5, len(rows) * 0.8), 3.5))
    curves = (("activation", "activation"), ("weight", "weight"), ("local", "layer output"),
              ("propagated", "propagated to output"))  # fmt: skip
    for key, label in curves:
        ys = [r[key]["sqnr_db"] if r.get(key) else float("nan") for r in rows]
        ax.plot(list(x), ys, marker="o", label=label)
    ax.set_xticks(list(x), names, rotation=45, ha="right")
    ax.set_ylabel("SQNR (dB)")
    ax.set_title(f"{doc['source']} / {doc['recipe']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "sqnr.png", dpi=110)
    plt.close(fig)
    files.append("sqnr.png")
    fig, ax = plt.subplots(figsize=(max(5, len(rows) * 0.8), 3.5))
    for k in ("p50_abs", "p90_abs", "p99_abs"):
        ys = [(r.get("propagated") or r["weight"])[k] for r in rows]
        ax.semilogy(list(x), ys, marker="o", label=k)
    ax.set_xticks(list(x), names, rotation=45, ha="right")
    ax.set_ylabel("|error| (propagated)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "error.png", dpi=110)
    plt.close(fig)
    files.append("error.png")
    return files


def run(args: argparse.Namespace) -> int:
    """The command: build the report, write it, update the trend, raise alarms."""
    import torch

    torch.manual_seed(args.seed)
    source = args.tensors or args.model
    if args.tensors:
        report = tensors_report(args.tensors, args.recipe)
    else:
        model, inputs = _load_model(args.model, args.seed)
        report = model_report(model, inputs, args.recipe)
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (Triton interpreter)"
    doc: dict[str, Any] = {
        "source": source, "recipe": args.recipe, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": dev, "torch": torch.__version__, "report": report,
    }  # fmt: skip
    doc["p99"] = _p99s(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trend_path = Path(args.trend) if args.trend else out / "trend.json"
    history = json.loads(trend_path.read_text()) if trend_path.exists() else []
    doc["alarms"] = _alarms(doc, history, args.alarm_factor)
    (out / "report.json").write_text(json.dumps(doc, indent=1))
    (out / "report.md").write_text(_markdown(doc))
    doc["plots"] = _plots(doc, out)
    entry = {k: doc[k] for k in ("source", "recipe", "date", "device", "p99")}
    entry["output_sqnr_db"] = report["output"]["sqnr_db"] if report.get("output") else None
    trend_path.parent.mkdir(parents=True, exist_ok=True)
    trend_path.write_text(json.dumps(([*history, entry])[-TREND_KEEP:], indent=1))
    print(_markdown(doc))
    print(f"wrote {out / 'report.json'}, {out / 'report.md'}, {', '.join(doc['plots'])}; "
          f"trend {trend_path} ({min(len(history) + 1, TREND_KEEP)} runs)")  # fmt: skip
    return 1 if doc["alarms"] and args.fail_on_alarm else 0


def cmd(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"
    return run(args)


def add_parser(sub: Any, parents: Any = ()) -> None:
    """The ``quant-report`` subcommand on the CLI's subparsers (``parents``: the options every
    subcommand takes)."""
    s = sub.add_parser(
        "quant-report", help="per-layer quantization error report with a trend", parents=parents
    )
    src = s.add_mutually_exclusive_group()
    src.add_argument(
        "--model",
        default="demo-mlp",
        help="'module:factory' returning (model, inputs), or demo-mlp",
    )
    src.add_argument("--tensors", help="a torch.save'd dict of name -> tensor")
    s.add_argument("--recipe", choices=RECIPES, default="float8_tensorwise")
    s.add_argument("--out", default="quant-report", help="report directory")
    s.add_argument("--trend", help="trend file (default: OUT/trend.json)")
    s.add_argument("--alarm-factor", type=float, default=1.5,
                   help="p99 alarm: this many times the median of earlier runs (1.5)")  # fmt: skip
    s.add_argument("--fail-on-alarm", action="store_true", help="exit 1 when an alarm is raised")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd)
