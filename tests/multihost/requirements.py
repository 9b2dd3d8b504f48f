"""Why the multi-host fixtures cannot run here, if they cannot: a skip reason, or None.

Outside CI such a test skips with the reason; in CI (SHOAL_CI=1) a skip fails the session
(tests/ci_skips.py), and .ci/system-packages installs what these checks look for.
"""

from __future__ import annotations

import os
import shutil

INSTALL_HINT = ("as root: .ci/system-packages "
                "(apt-get install openssh-server openssh-client iproute2 rsync slurm-wlm munge)")

HOST_TOOLS = {"ip": "iproute2", "tc": "iproute2", "ssh": "openssh-client", "ssh-keygen": "openssh-client",
              "/usr/sbin/sshd": "openssh-server"}
SLURM_TOOLS = {"munged": "munge", "munge": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
               "sbatch": "slurm-client", "srun": "slurm-client", "squeue": "slurm-client",
               "scancel": "slurm-client", "sinfo": "slurm-client"}


def _missing(tools: dict[str, str]) -> str | None:
    absent = [f"{t} ({pkg})" for t, pkg in tools.items() if shutil.which(t) is None]
    return f"needs {', '.join(absent)}; install {INSTALL_HINT}" if absent else None


def hosts_unavailable() -> str | None:
    """Skip reason for tests that need network namespaces with sshd, or None when they can run."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces, veth pairs and a bridge (CI runs as root)"
    return _missing(HOST_TOOLS)


def slurm_unavailable() -> str | None:
    """Skip reason for tests that need a local Slurm, or None when they can run."""
    if os.geteuid() != 0:
        return "needs root to run munged, slurmctld and slurmd (CI runs as root)"
    return _missing(SLURM_TOOLS)
