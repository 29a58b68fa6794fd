"""GPU checks for issue 31 (a newcomer never meets garbage, a traceback or silence).

    PYTHONPATH=src python3 experiments/gpu_newcomer.py      # one GPU, about 5-10 minutes

1. tests/test_bad_input.py on the GPU (CUDA tensors): every public function and nn module
   against bad input; the counts and each failure (Acceptance 3: its output is committed).
2. The command line's GPU path, which no CPU test reaches: `bench` on a small selection
   (progress on stderr, report.md with its plots, results.json), a second bench into DIR-2,
   `bench --shapes` with an explicit shape, `tune` with progress, `--profile h200` in any case,
   `report DIR`, `regress` of the two runs, and one-line errors with exit code 2.

Writes everything to $OUT/newcomer.json when OUT is set; prints a short table last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def sh(args: list[str], timeout: int) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
    return {
        "cmd": " ".join(args[2:]) if args[:3] == [sys.executable, "-m", "tritonkit"] else args,
        "rc": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "stdout_tail": out[-2000:],
        "stderr_tail": err[-2000:],
    }


def tk(*args: str, timeout: int = 300) -> dict:
    return sh([sys.executable, "-m", "tritonkit", *args], timeout)


def bad_input_tests(tmp: Path) -> dict:
    xml = tmp / "junit.xml"
    run = sh(
        [sys.executable, "-m", "pytest", "tests/test_bad_input.py", "-q", "-p",
         "no:cacheprovider", f"--junitxml={xml}"],
        timeout=420,
    )  # fmt: skip
    counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}
    failures = []
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            bad = case.find("failure")
            bad = bad if bad is not None else case.find("error")
            skip = case.find("skipped")
            if bad is not None:
                counts["failed"] += 1
                message = (bad.get("message") or "").splitlines()
                failures.append(f"{case.get('name')}: {message[0] if message else ''}"[:300])
            elif skip is not None:
                counts["xfailed" if skip.get("type") == "pytest.xfail" else "skipped"] += 1
            else:
                counts["passed"] += 1
    return {**run, "counts": counts, "failures": failures}


def cli_checks(tmp: Path) -> list[dict]:
    d = tmp / "rep"
    checks = []

    def check(name: str, result: dict, ok: bool, detail: str = "") -> None:
        checks.append({"check": name, "ok": bool(ok), "detail": detail, **result})

    r = tk("bench", "relu", "--dtypes", "fp32", "--mode", "fwd", "--baselines", "torch",
           "--out", str(d), "--seed", "1")  # fmt: skip
    files = sorted(p.name for p in d.glob("*")) if d.exists() else []
    kind = json.loads((d / "results.json").read_text())["kind"] if "results.json" in files else None
    want = {"report.md", "results.json", "roofline.png", "speedup_vs_torch.png", "accuracy.png"}
    check(
        "bench on the GPU: report, plots, progress",
        r,
        r["rc"] == 0 and kind == "gpu" and want <= set(files) and "bench [" in r["stderr_tail"],
        f"files {files}",
    )
    r = tk("bench", "relu", "--dtypes", "fp32", "--mode", "fwd", "--baselines", "torch",
           "--out", str(d), "--seed", "2")  # fmt: skip
    check(
        "a second bench goes to DIR-2",
        r,
        r["rc"] == 0 and "writing to" in r["stderr_tail"] and (tmp / "rep-2").is_dir(),
    )
    e = tmp / "explicit"
    r = tk("bench", "relu", "--dtypes", "fp32", "--mode", "fwd,bwd", "--baselines", "torch",
           "--shapes", "(1024, 1000)", "--no-check", "--out", str(e))  # fmt: skip
    shapes = (
        sorted({b["shape"] for b in json.loads((e / "results.json").read_text())["bench"]})
        if (e / "results.json").exists()
        else []
    )
    ok = r["rc"] == 0 and shapes == ["(1024, 1000)"]
    check("bench --shapes '(1024, 1000)'", r, ok, str(shapes))
    r = tk("tune", "matmul", "--shapes", "(512, 512, 512)", "--dtypes", "fp16", timeout=400)
    check("tune with progress", r, r["rc"] == 0 and "tune [" in r["stderr_tail"])
    r = tk("--profile", "h200", "doctor")
    check("--profile h200 (any case)", r, r["rc"] == 0 and "NVIDIA H200" in r["stdout_tail"])
    r = tk("report", str(d))
    check("report DIR re-renders in place", r, r["rc"] == 0 and "report.md" in r["stdout_tail"])
    r = tk("regress", str(d), "--against", str(tmp / "rep-2"), "--threshold", "0.5")
    check("regress reads both runs", r, r["rc"] in (0, 1), "exit 0 or 1, never 2")
    for args in (["bench", "relu", "--mode", "fwdd"], ["--profile", "nope", "doctor"],
                 ["bench", "matmul", "--dtypes", "fp8"]):  # fmt: skip
        r = tk(*args)
        lines = r["stderr_tail"].strip().splitlines()
        check(f"error: {' '.join(args)}", r, r["rc"] == 2 and len(lines) == 1, lines[-1:])
    return checks


def main() -> None:
    import torch

    results: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    with tempfile.TemporaryDirectory() as tmp:
        results["bad_input"] = bad_input_tests(Path(tmp))
        results["cli"] = cli_checks(Path(tmp))
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "newcomer.json"
        out.write_text(json.dumps(results, indent=1, default=str))
    b = results["bad_input"]
    print(f"\ndevice: {results['device']}")
    print(f"tests/test_bad_input.py: {b['counts']} in {b['seconds']} s (rc {b['rc']})")
    for f in b["failures"][:30]:
        print(f"  FAILED {f}")
    print(f"\n{'check':<46} {'ok':<4} {'rc':<8} {'s':>6}  detail")
    for c in results["cli"]:
        print(f"{c['check'][:46]:<46} {'yes' if c['ok'] else 'NO':<4} {c['rc']!s:<8} "
              f"{c['seconds']:>6}  {str(c['detail'])[:60]}")  # fmt: skip


if __name__ == "__main__":
    main()
