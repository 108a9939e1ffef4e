"""The processes of a running server, read from /proc: its descendants, their titles, whether they
outlived it, and their memory.

The engine's children name themselves (`cadence:scheduler`, `cadence:tokenizer`,
`cadence:executor dp=1 tp=0`), so a drill can kill one by title and a soak can watch each one's
RSS. A pid is remembered with its start time, so a recycled pid is never taken for a survivor.
Linux only.
"""

from __future__ import annotations

import collections
import os
import time


def stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time in clock ticks) of a live process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> list[int]:
    """Every living descendant of `root`, children first."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        info = stat(int(entry)) if entry.isdigit() else None
        if info is not None:
            children[info[0]].append(int(entry))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def cmdline(pid: int) -> str:
    """The command line, which is the title for the engine's processes; "" once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def find_by_title(root: int, title: str) -> int:
    """The descendant of `root` whose title starts with `title`; LookupError naming those there are."""
    found = {pid: cmdline(pid) for pid in descendants(root)}
    for pid, line in found.items():
        if line.startswith(title):
            return pid
    raise LookupError(f"no process titled {title!r} under pid {root}; there are {sorted(found.values())}")


def remember(root: int) -> dict[int, int]:
    """`root` and its descendants now, each with its start time, for `survivors` later."""
    known = {}
    for pid in [root, *descendants(root)]:
        info = stat(pid)
        if info is not None:
            known[pid] = info[2]
    return known


def survivors(known: dict[int, int], wait_s: float = 0.0) -> list[int]:
    """Those of `known` still running (the same process, not a zombie), after waiting up to `wait_s`
    for them to go. A child outlives a crashed parent by being reparented, so it is found here even
    once its parent has gone."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [pid for pid, ticks in known.items()
                 if (info := stat(pid)) is not None and info[2] == ticks and info[1] != "Z"]
        if not alive or time.monotonic() >= deadline:
            return sorted(alive)
        time.sleep(0.2)


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process in MiB, None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None
