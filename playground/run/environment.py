"""What produced a run's numbers: versions, device, node, threads, the native kernels'
state, the linear layers' library and the git commit, as env.json records them."""

from __future__ import annotations

import datetime
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from playground.kernels import native
from playground.model import linear_layers
from playground.model.cpu_detection import cpuinfo_field

PACKAGE_DIR = Path(__file__).resolve().parent.parent
"""playground/, where `git rev-parse` finds the checkout the run's code came from."""


def _git_commit() -> str | None:
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None


def _version() -> str | None:
    """The installed distribution's version (pyproject.toml's); None when the package runs
    from a tree that was never installed."""
    try:
        return metadata.version("attention-playground")
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def environment(device: str, threads: int | None = None) -> dict[str, Any]:
    """What produced the numbers: versions, device, node, the torch threads the cells are
    measured with (default: torch.get_num_threads()), the native kernels' status, the
    linear layers' library, commit."""
    cuda = device == "cuda"
    return {
        "playground_version": _version(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else _cpu_name(),
        "cuda_version": torch.version.cuda if cuda else None,
        "node": platform.node(),
        "threads": torch.get_num_threads() if threads is None else threads,
        # Learned relative biases train on the C++ backward, or on the Python one: say which.
        "native_kernels": native.build_state().reason,
        # The library the classifier model's float32 CPU linear layers run on.
        "linear_backend": linear_layers.backend(),
        "git_commit": _git_commit(),
        "started_at": datetime.datetime.now().isoformat(timespec="seconds"),
    }
