"""Test task: prints --lines numbered lines as fast as it can, each in two raw writes
(so the launcher sees partial lines), the last one without a trailing newline."""

import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, default=5000)
args = parser.parse_args()
task = os.environ["SHOAL_TASK"]
for i in range(args.lines):
    head = f"{task} line {i} "
    os.write(1, head.encode())
    tail = "x" * (i % 97) + " end"
    os.write(1, (tail + ("\n" if i < args.lines - 1 else "")).encode())
