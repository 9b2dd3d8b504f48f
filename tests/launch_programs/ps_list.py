"""A task for the ps scaling test: prints its TF_CONFIG's task and ps list as one JSON line
("tf_config {...}"); then a worker waits for the file `finish` in OUTPUT_DIR (exits 0) and a
ps for SIGTERM (exits 0). SIGTERM makes either exit 0 at once."""

import json
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
config = json.loads(os.environ["TF_CONFIG"])
print("tf_config " + json.dumps({"task": config["task"], "ps": config["cluster"].get("ps", [])}), flush=True)
finish = os.path.join(os.environ["OUTPUT_DIR"], "finish")
while config["task"]["type"] == "ps" or not os.path.exists(finish):
    time.sleep(0.1)
