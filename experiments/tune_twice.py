"""Evidence for the persistent autotune cache: tune one operator in two fresh processes.

The first process finds no cached config and times the candidates; the second, a new Python
process with the same cache directory, must find the winner and time nothing. Prints both
processes' wall time and what `tritonkit tune` reported.

    python experiments/tune_twice.py transpose --dtypes bf16
"""

import subprocess
import sys
import time


def main() -> None:
    args = [sys.executable, "-m", "tritonkit", "tune", *sys.argv[1:]]
    for i in (1, 2):
        t0 = time.perf_counter()
        out = subprocess.run(args, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        print(f"--- process {i}: {wall:.1f} s wall (exit {out.returncode})")
        print(out.stdout.strip()[-1500:])
        if out.returncode:
            print(out.stderr.strip()[-1500:])


if __name__ == "__main__":
    main()
