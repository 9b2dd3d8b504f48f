"""A training-like task for the launcher's tests: `until_file.py STOP_FILE`.

Prints `step=N loss=X` (what the launcher's progress line reads) every 0.1 s until STOP_FILE
exists, then exits 0. Binds nothing, so a restarted copy never finds its port taken.
"""

import os
import sys
import time

stop = sys.argv[1]
print(f"{os.environ.get('SHOAL_TASK', '?')} up", flush=True)
step = 0
while not os.path.exists(stop):
    step += 1
    print(f"step={step} loss={1.0 / step:.4f}", flush=True)
    time.sleep(0.1)
print("done", flush=True)
