"""Set up test hosts or Slurm, then die without any teardown, as a crashed test run would.

`python -m tests.multihost.programs.crash_after_setup hosts|slurm` (from the repository root)
prints one JSON line naming what it left behind, then exits with os._exit(1).
"""

import json
import os
import sys

from tests.multihost import procs
from tests.multihost.network import HostNetwork
from tests.multihost.slurm import SlurmCluster


def hosts() -> dict:
    network = HostNetwork()
    network.start()
    host = network.add_host()
    return {"netns": host.netns, "veth": host.veth, "bridge": network.bridge, "dir": str(network.workdir),
            "pids": [host.sshd_pid]}


def slurm() -> dict:
    cluster = SlurmCluster(dict(os.environ))
    cluster.start()
    job = cluster.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "echo $$ > job.pid; exec sleep 600"],
                      cwd=cluster.workdir).stdout.strip().split(";")[0]
    pid_file = cluster.workdir / "job.pid"
    procs.wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", timeout=30,
                     what=f"batch job {job} running")
    daemons = [p.pid for p in cluster._daemons] + [cluster._munged.pid]
    return {"dir": str(cluster.workdir), "pids": daemons + [int(pid_file.read_text())]}


if __name__ == "__main__":
    print(json.dumps({"hosts": hosts, "slurm": slurm}[sys.argv[1]]()), flush=True)
    os._exit(1)
