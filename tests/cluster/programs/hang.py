"""Prints progress lines, then hangs: for the launcher's watchdog tests.

Every task runs it; its task comes from $SHOAL_TASK ("worker:1"). A training task prints
`<task> step=N loss=X` for N = 1..--steps, every --every seconds, then sleeps until it is
stopped; the --hang task stops printing after --hang_after steps. A ps prints nothing and sleeps."""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--every", type=float, default=0.05)
    parser.add_argument("--hang", default="worker:1")
    parser.add_argument("--hang_after", type=int, default=3)
    args = parser.parse_args()
    task = os.environ["SHOAL_TASK"]
    if not task.startswith("ps"):
        last = args.hang_after if task == args.hang else args.steps
        for step in range(1, last + 1):
            print(f"{task} step={step} loss={1.0 / step:.4f} examples/s=10", flush=True)
            time.sleep(args.every)
    time.sleep(600)  # the test stops it long before
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
