"""Every socket address of one run, built in one place.

By default each endpoint is an `ipc://` socket in a private runtime directory,
`$XDG_RUNTIME_DIR/cadence/<run-id>/` or `/tmp/cadence-<uid>/<run-id>/`, created with mode 0700 so no
other user can connect. A directory that exists but is owned by another user, is a symlink or grants
any group/other permission is refused, because whoever controls it could interpose on our sockets.
`tcp://host:port` is used only for the roles named in `tcp` (remote native clients, executors on
another host). The launcher creates the Endpoints, passes it to every process, and calls `cleanup()`
at shutdown, whatever ended the run. While the Endpoints live they hold the run directory's lock
(ipc/run_lock.py), which tells the others whether the run is still on.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ipc.run_lock import RunLock

# Roles with one endpoint per run; each DP replica also has a doorbell, role "doorbell.<replica>".
ROLES = ("tokenizer_frontend", "scheduler_input", "tokenizer_output", "results")
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_HOST_PORT = re.compile(r"(?P<host>[A-Za-z0-9_.:*\[\]-]+):(?P<port>[0-9]{1,5})")
_MAX_IPC_PATH = 107  # sun_path is 108 bytes on Linux, including the terminating NUL


class UnsafeRuntimeDir(PermissionError):
    """The runtime directory could be read or replaced by another user."""


@dataclass(frozen=True)
class Endpoints:
    run_id: str
    runtime_dir: Path  # private to this run; removed by cleanup()
    tokenizer_frontend: str  # clients -> tokenizer (requests)
    scheduler_input: str  # tokenizer -> scheduler (tokenized requests, aborts)
    tokenizer_output: str  # scheduler -> tokenizer (token ids to detokenize)
    results: str  # executors -> scheduler (step results)
    doorbells: tuple[str, ...]  # scheduler -> executors of replica i: "plan in slot k is ready"
    lock: RunLock | None = field(default=None, compare=False, repr=False)  # held until cleanup()

    def __post_init__(self) -> None:
        if not _RUN_ID.fullmatch(self.run_id):
            raise ValueError(f"run id {self.run_id!r} must be 1-64 characters of [A-Za-z0-9_.-]")
        if not self.doorbells:
            raise ValueError("Endpoints needs at least one replica doorbell")

    @classmethod
    def create(
        cls,
        run_id: str,
        num_replicas: int = 1,
        *,
        tcp: Mapping[str, str] | None = None,
        runtime_root: Path | str | None = None,
    ) -> Endpoints:
        """Make the private runtime directory and name every endpoint.

        `tcp` maps a role ("results", "doorbell.0", ...) to "host:port" for endpoints that must be
        reachable from another host. `runtime_root` overrides the per-user directory (tests).
        """
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if not _RUN_ID.fullmatch(run_id):
            raise ValueError(f"run id {run_id!r} must be 1-64 characters of [A-Za-z0-9_.-]")
        tcp = dict(tcp or {})
        roles = [*ROLES, *(f"doorbell.{i}" for i in range(num_replicas))]
        unknown = sorted(set(tcp) - set(roles))
        if unknown:
            raise ValueError(f"tcp endpoints for unknown role(s) {unknown}; roles are {roles}")
        root = Path(runtime_root) if runtime_root is not None else default_runtime_root()
        run_dir = root / run_id
        addresses = {role: _address(role, run_dir, tcp.get(role)) for role in roles}
        _make_private_dir(root)
        _make_private_dir(run_dir)
        try:
            lock = RunLock.hold(run_dir)
        except BlockingIOError:
            raise RuntimeError(f"runtime dir {run_dir} belongs to a run that is still on") from None
        return cls(
            run_id=run_id,
            runtime_dir=run_dir,
            **{role: addresses[role] for role in ROLES},
            doorbells=tuple(addresses[f"doorbell.{i}"] for i in range(num_replicas)),
            lock=lock,
        )

    @property
    def num_replicas(self) -> int:
        return len(self.doorbells)

    def doorbell(self, replica: int) -> str:
        if not 0 <= replica < len(self.doorbells):
            raise IndexError(
                f"no doorbell for replica {replica}: the run has {len(self.doorbells)} replica(s)"
            )
        return self.doorbells[replica]

    def cleanup(self) -> None:
        """Remove this run's runtime directory and its socket files, then let go of its lock; safe
        to call twice."""
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self.lock is not None:
            self.lock.release()


def default_runtime_root() -> Path:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "cadence"
    return Path("/tmp") / f"cadence-{os.getuid()}"


def _address(role: str, run_dir: Path, host_port: str | None) -> str:
    if host_port is not None:
        m = _HOST_PORT.fullmatch(host_port)
        if m is None or not 0 < int(m["port"]) < 65536:
            raise ValueError(
                f"tcp endpoint for {role} must be 'host:port' with port 1-65535, got {host_port!r}"
            )
        return f"tcp://{host_port}"
    path = run_dir / f"{role}.sock"
    if len(str(path)) > _MAX_IPC_PATH:
        raise ValueError(
            f"ipc socket path {path} is {len(str(path))} bytes, over the {_MAX_IPC_PATH}-byte "
            "limit of a Unix socket; use a shorter run id or runtime root"
        )
    return f"ipc://{path}"


def _make_private_dir(path: Path) -> None:
    """Create `path` with mode 0700, or check that the existing one is ours and private."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeRuntimeDir(
            f"runtime dir {path} is not a directory (a symlink or file); refusing to use it"
        )
    if st.st_uid != os.getuid():
        raise UnsafeRuntimeDir(
            f"runtime dir {path} is owned by uid {st.st_uid}, not by this user "
            f"(uid {os.getuid()}); refusing to use it"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise UnsafeRuntimeDir(
            f"runtime dir {path} has mode {mode:04o}; it must grant nothing to group or "
            f"other (chmod 700 {path})"
        )
