"""A child's SIGTERM becomes one `Stopping`, even when it lands inside a finalizer.

Each case runs in a fresh interpreter: the handlers are process-wide (and SIGALRM is theirs).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = textwrap.dedent("""
    import os, signal, sys, time
    from procs.child import Stopping, _raise_stopping
    signal.signal(signal.SIGTERM, _raise_stopping)
    signal.signal(signal.SIGALRM, _raise_stopping)
    dropped = []
    sys.unraisablehook = lambda unraisable: dropped.append(repr(unraisable.exc_value))

    def wait_for_stopping(seconds, send=False):
        deadline = time.monotonic() + seconds
        try:
            if send:
                os.kill(os.getpid(), signal.SIGTERM)
            while time.monotonic() < deadline:
                time.sleep(0.001)
        except Stopping as exc:
            return exc
        return None
""")


def run_case(body: str) -> list[str]:
    script = PRELUDE + textwrap.dedent(body)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_sigterm_raises_stopping_in_the_loop():
    out = run_case("""
        print(wait_for_stopping(5.0, send=True), dropped == [])
    """)
    assert out == ["SIGTERM", "True"]


def test_sigterm_inside_a_finalizer_is_raised_after_it_not_dropped():
    out = run_case("""
        class Socket:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # the handler runs here, between bytecodes of __del__
                    pass
                print("finalizer-finished")

        Socket()
        print(wait_for_stopping(5.0), dropped)
    """)
    assert out == ["finalizer-finished", "SIGTERM", "[]"]


def test_a_second_sigterm_leaves_the_cleanup_alone():
    out = run_case("""
        first = wait_for_stopping(5.0, send=True)
        print(first, wait_for_stopping(0.2, send=True))
    """)
    assert out == ["SIGTERM", "None"]


def test_the_launchers_death_stops_a_child_as_sigterm_does_and_is_told_apart():
    out = run_case("""
        from procs.child import PARENT_DIED_SIGNAL, _parent_died, launcher_died
        signal.signal(PARENT_DIED_SIGNAL, _parent_died)
        print(launcher_died())
        try:
            os.kill(os.getpid(), PARENT_DIED_SIGNAL)
            time.sleep(5)
        except Stopping:
            print("stopped", launcher_died())
    """)
    assert out == ["False", "stopped", "True"]
