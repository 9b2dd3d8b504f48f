"""Test task: a server that runs until it is stopped (like a TF ps), at most 60 s.

--fork starts a grandchild in the same process group and prints its pid, to check that
teardown reaches the whole group; --ignore-term makes it ignore SIGTERM (KILL needed).
"""

import argparse
import os
import signal
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fork", action="store_true")
parser.add_argument("--ignore-term", action="store_true")
parser.add_argument("--lifetime", type=float, default=60.0)
args = parser.parse_args()
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"serving {os.environ.get('SHOAL_TASK')} pid {os.getpid()}", flush=True)
if args.fork:
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({args.lifetime})"])
    print(f"grandchild pid {child.pid}", flush=True)
time.sleep(args.lifetime)
