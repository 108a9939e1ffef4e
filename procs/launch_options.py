"""LaunchOptions: how the launcher runs the system, apart from the engine's own configuration.

The launcher takes them; `procs.args` makes them from the command line.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchOptions:
    served_model_name: str | None = None  # default: the model's name
    tokenizer_path: str | None = None  # default: the model directory (or the built-in vocabulary)
    chat_template: str | None = None  # a Jinja chat template's text, in place of the tokenizer's
    startup_timeout_s: float = 900.0  # loading 30 GB of weights and profiling takes minutes
    # A step with no result for this long takes its replica down. Far above the slowest legitimate
    # step (a full 8,192-token prefill of the 14B model takes under a second on an H200; the Triton
    # compiles happen at start-up), far below the minute after which a user gives up.
    step_timeout_s: float = 30.0
    # A TP rank waits this long for its peers at start-up (the rendezvous, the first all-reduce), and
    # a collective of the group fails after it. Ranks start together and reach the rendezvous
    # within seconds of each other, and ranks that load their shards in parallel reach the warm-up's
    # first collective within seconds too; two minutes is far above both and a fifth of the
    # ten-minute NCCL default that vLLM and SGLang keep, after which a missing rank is reported
    # instead of a start-up that just hangs.
    dist_timeout_s: float = 120.0
    shutdown_timeout_s: float = 10.0  # per stage, before SIGKILL
    runtime_root: str | None = None  # where the private socket directory goes (tests)
    # tcp://host:port the tokenizer's front end listens on too, for native clients on other machines
    native_tcp: str | None = None
    # with native_tcp: the key every client of the front end presents (ipc/native_auth.py); None: open
    native_api_key: str | None = None


    def __post_init__(self) -> None:
        if not self.dist_timeout_s > 0:
            raise ValueError(f"--dist-timeout must be positive (seconds), not {self.dist_timeout_s}")
        if self.native_tcp is not None and not self.native_tcp.startswith("tcp://"):
            raise ValueError(f"native_tcp must be a tcp://host:port address, got {self.native_tcp!r}")
        if self.native_api_key is not None and not self.native_api_key:
            raise ValueError("native_api_key must not be empty (use None for no key)")
