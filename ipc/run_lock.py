"""Whether a run is still on: its launcher holds an flock on `<run dir>/run.lock` while the run lives.

The kernel drops the lock when the launcher's process ends, however it ends (SIGKILL included), and
before the launcher's children get their parent-death SIGTERM. Whoever then finds the lock free
knows that nobody will remove the run's directory and may remove it: the tokenizer on its way out
after its launcher was SIGKILLed, and the next launcher's start after a run killed whole (every
process at once). A pid would not tell as much: in another pid namespace (a container sharing the
directory) a live launcher's pid looks dead.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

LOCK_NAME = "run.lock"


class RunLock:
    """The launcher's hold on its run directory; `release` it after removing the directory."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def hold(cls, run_dir: Path) -> RunLock:
        """Take the lock of a run directory just made (nobody else can hold it yet)."""
        fd = os.open(run_dir / LOCK_NAME, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        return cls(fd)

    def release(self) -> None:
        """Drop the lock; safe to call twice."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def remove_if_ended(run_dir: Path) -> bool:
    """Remove `run_dir` if no launcher holds its lock; True if it did. A directory without a lock
    file (one being made this instant, or not a run) is left alone."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its launcher lives
        shutil.rmtree(run_dir, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def remove_once_ended(run_dir: Path, wait_s: float) -> bool:
    """`remove_if_ended`, retried for up to `wait_s`: a child told that its launcher died may be told
    before the kernel has let go of the dying launcher's lock."""
    deadline = time.monotonic() + wait_s
    while not remove_if_ended(run_dir):
        if time.monotonic() >= deadline or not run_dir.exists():
            return False
        time.sleep(0.02)
    return True


def remove_ended_runs(runtime_root: Path) -> list[str]:
    """Remove the directories under `runtime_root` of runs whose launcher is gone; their names."""
    if not runtime_root.is_dir() or runtime_root.is_symlink():
        return []
    return sorted(d.name for d in runtime_root.iterdir()
                  if d.is_dir() and not d.is_symlink() and remove_if_ended(d))
