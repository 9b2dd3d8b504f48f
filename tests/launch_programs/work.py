"""Test task: a worker that reports a few steps and exits with --exit (default 0)."""

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("--sleep", type=float, default=0.2)
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()
task = os.environ.get("SHOAL_TASK")
for step in range(1, args.steps + 1):
    print(f"step={step * 10} loss={1.0 / step:.4f} task={task}", flush=True)
    time.sleep(args.sleep / args.steps)
print(f"{task} done, exit {args.exit}", flush=True)
sys.exit(args.exit)
