"""Where a matrix run ran: platform, CPU, GPUs, python, torch, the Cadence commit and the FP8 GEMM
named by the environment, for its report."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def environment() -> dict[str, object]:
    import torch

    gpus = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else [])
    return {
        "platform": platform.platform(), "machine": platform.machine(), "processor": _cpu_name(),
        "cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)), "gpus": gpus,
        "python": platform.python_version(), "torch": torch.__version__, "cadence_commit": _git_commit(),
        "fp8_gemm": os.environ.get("CADENCE_FP8_GEMM"),  # None: auto (the servers inherit this process's)
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor())
    except OSError:
        return platform.processor()


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + (" (with uncommitted changes)" if dirty else "")
