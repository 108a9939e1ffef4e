"""A child whose actor closed leaves without the interpreter's teardown (`procs/child.py`
`run_actor`, `exit_after_cleanup`): exit code 0, what its close() queued on a socket still
delivered, no atexit handler run, and a socket left open does not hold it. The case runs in a fresh
interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import zmq

CHILD = textwrap.dedent("""
    import atexit, logging, multiprocessing, sys
    import zmq
    from ipc.process_specs import Ready
    from procs.child import run_actor

    address = sys.argv[1]
    atexit.register(lambda: print("atexit ran", flush=True))

    class Actor:
        def loop(self):
            print("loop", flush=True)

        def close(self):
            context = zmq.Context.instance()
            push = context.socket(zmq.PUSH)
            push.linger = 200
            push.connect(address)
            push.send(b"closed")  # queued: leaves during the exit's LINGER, not before close() returns
            push.close()
            self.forgotten = context.socket(zmq.DEALER)  # never closed: must not hold the exit
            self.forgotten.connect("tcp://127.0.0.1:9")
            self.forgotten.send(b"nobody listens", zmq.NOBLOCK)

    _, ready_w = multiprocessing.Pipe(duplex=False)
    run_actor(ready_w, Ready("executor", 0), logging.getLogger("child"), Actor)
    print("returned from run_actor", flush=True)
""")


def test_a_closed_actor_exits_at_once_delivering_what_it_queued():
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        started = time.monotonic()
        child = subprocess.run([sys.executable, "-c", CHILD, f"tcp://127.0.0.1:{port}"], capture_output=True,
                               text=True, timeout=60)
        elapsed = time.monotonic() - started
        assert child.returncode == 0, child.stderr
        assert child.stdout.split("\n")[:-1] == ["loop"], child.stdout  # no atexit, no return
        assert pull.poll(5000), "the message close() queued was dropped"
        assert pull.recv() == b"closed"
        assert elapsed < 30, f"the child took {elapsed:.1f} s to leave"
    finally:
        pull.close(linger=0)
        context.term()
