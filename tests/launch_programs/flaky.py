"""Test task: fails (exit 1) on its first --fail-times attempts, then succeeds.

Attempts are counted in a file in $OUTPUT_DIR, one per task; each attempt prints its
TF_CONFIG so a test can check that a restart keeps the task's identity.
"""

import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--fail-times", type=int, default=1)
args = parser.parse_args()
task = os.environ["SHOAL_TASK"].replace(":", ".")
counter = os.path.join(os.environ["OUTPUT_DIR"], f"attempts-{task}")
attempt = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
with open(counter, "w") as f:
    f.write(str(attempt))
print(f"attempt {attempt} TF_CONFIG {os.environ['TF_CONFIG']}", flush=True)
sys.exit(1 if attempt <= args.fail_times else 0)
