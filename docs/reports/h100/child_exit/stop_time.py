"""How long a server's stop takes: a launcher around qwen3-tiny, each child's stop timed.

Run from the repository root: `python docs/reports/h100/child_exit/stop_time.py cuda` (or `cpu`).
"""

import dataclasses
import sys
import time

sys.path[:0] = [".", "tests"]
from system_client import tiny_config  # noqa: E402

from procs import launcher  # noqa: E402
from procs.launch_options import LaunchOptions  # noqa: E402

_untimed_stop = launcher._stop


def _timed_stop(child, *args, **kwargs):
    started = time.time()
    _untimed_stop(child, *args, **kwargs)
    print(f"  _stop {child.name}: {time.time() - started:.3f}", flush=True)


if __name__ == "__main__":
    launcher._stop = _timed_stop
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    for dp, tp in ((1, 1), (2, 1), (1, 1)):
        config = dataclasses.replace(tiny_config(dp=dp, tp=tp), device=device)
        with launcher.Launcher(config, LaunchOptions(startup_timeout_s=180)):
            stop_began = time.time()
        print(f"dp{dp} tp{tp}: stop {time.time() - stop_began:.2f}", flush=True)
