"""A task for the scaling tests, by SHOAL_TASK: a ps prints one membership line (the format
a ps logs on every membership change) and waits to be stopped; a worker prints a progress
line every 0.1 s until the file `finish` appears in OUTPUT_DIR (then exits 0). SIGTERM makes
either exit 0 at once."""

import os
import signal
import sys
import time

task = os.environ["SHOAL_TASK"]
finish = os.path.join(os.environ["OUTPUT_DIR"], "finish")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if task.startswith("ps:"):
    print(f"2026-01-01 12:00:00,000 INFO {task} membership v3: 2 training [worker:0, worker:1];"
          " worker:2 left (no heartbeat for 20s)", flush=True)
    while True:
        time.sleep(0.1)
step = 0
while not os.path.exists(finish):
    step += 1
    print(f"{task} step={step} loss=0.5", flush=True)
    time.sleep(0.1)
