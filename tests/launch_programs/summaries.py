"""Test task: writes TensorBoard summaries with Shoal's TaskSummaries into --dir (the chief
or worker 0 there, other workers below it, as a training session does), then exits. A ps
task (given with --ps) writes none and exits at once."""

import argparse
import os
import sys
from pathlib import Path

from shoal.train.summaries import TaskSummaries

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
args = parser.parse_args()
job, index = os.environ["SHOAL_TASK"].split(":")
if job == "ps":
    sys.exit(0)
first = index == "0"
logdir = Path(args.dir) if first else Path(args.dir) / f"{job}_{index}"
summaries = TaskSummaries(logdir, is_chief=first).open()
summaries.scalar("loss", 0.5, 1)
summaries.close()
print(f"{job}:{index} wrote summaries", flush=True)
