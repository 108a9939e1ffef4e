"""The processes of a running server, read from /proc: its descendants by title, and their memory.

The engine's children name themselves (`cadence:scheduler`, `cadence:tokenizer`,
`cadence:executor dp=1 tp=0`), so a drill can kill one by title and a soak can watch each one's
RSS. Linux only.
"""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> dict[int, str]:
    """Every living descendant of `pid`, with its command line (its title, for the engine's)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces
        parents[int(entry.name)] = (ppid, cmdline)
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, cmdline) in parents.items():
            if ppid == parent and child not in found:
                found[child] = cmdline
                frontier.append(child)
    return found


def find_by_title(pid: int, title: str) -> int:
    """The descendant of `pid` whose title starts with `title`; LookupError naming those there are."""
    found = descendants(pid)
    for child, cmdline in found.items():
        if cmdline.startswith(title):
            return child
    raise LookupError(f"no process titled {title!r} under pid {pid}; there are {sorted(found.values())}")


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process, None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
