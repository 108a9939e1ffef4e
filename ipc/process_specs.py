"""What a child process is started with and what it answers when it has started, as ipc.codec
messages: the launcher passes each child its spec (ExecutorSpec, SchedulerSpec, TokenizerSpec),
encoded, as its argument; every child writes one Ready, encoded, to a pipe the launcher reads.
The messages the running processes exchange are ipc/messages.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import EngineConfig
from ipc.codec import message

# --- startup ----------------------------------------------------------------------------------------


@message
@dataclass(frozen=True)
class Ready:
    role: str  # "executor", "scheduler" or "tokenizer"
    pid: int
    replica: int = -1
    rank: int = -1
    num_pages: int = 0  # executors: KV pages that fit after profiling memory
    error: str | None = None  # a child that could not start says why here


# --- what a child process is started with (encoded, passed as its argument) -----------------------


@message
@dataclass(frozen=True)
class ExecutorSpec:
    config: EngineConfig
    replica: int
    rank: int
    device: str  # "cpu" or "cuda:N"
    doorbell: str  # the replica's doorbell address (SUB)
    results: str  # the scheduler's results address (PUSH)
    ring_name: str  # the replica's shared-memory ring in /dev/shm
    dist_init_method: str  # torch.distributed rendezvous of the replica's TP group ("" at tp=1)
    dist_backend: str  # "nccl" or "gloo"
    kv_memory_share: float  # fraction of the card this executor may plan with (cards shared by replicas)
    spin_s: float = 0.0  # how long to watch the ring for the next step before blocking on the doorbell
    dist_timeout_s: float = 120.0
    # Where rank 0 loads the tokenizer's tokens for structured outputs (None: the model directory or
    # the built-in vocabulary, as the tokenizer process does)
    tokenizer_path: str | None = None


@message
@dataclass(frozen=True)
class SchedulerSpec:
    config: EngineConfig
    run_id: str
    num_pages: list[int]  # per replica: the minimum over its TP ranks
    inputs: str  # PULL: tokenized requests, aborts, launcher notices
    outputs: str  # PUSH: to the tokenizer
    results: str  # PULL: executor results
    doorbells: list[str]  # PUB per replica
    step_timeout_s: float  # a step with no result past this takes its replica down
    ring_slots: int = 4
    executor_pids: list[list[int]] = field(default_factory=list)  # per replica, by rank: killed when stuck


@message
@dataclass(frozen=True)
class TokenizerSpec:
    config: EngineConfig
    served_model_name: str
    tokenizer_path: str | None  # a Hugging Face directory; None: the built-in Qwen vocabulary
    frontend: str  # ROUTER for clients
    to_scheduler: str  # PUSH
    from_scheduler: str  # PULL
    frontend_tcp: str | None = None  # tcp://host:port the ROUTER listens on too (remote native clients)
    api_key: str | None = None  # with frontend_tcp: every client of the ROUTER must present it
    run_dir: str | None = None  # the run's socket directory: removed on exit here if the launcher is gone
    chat_template: str | None = None  # `--chat-template`'s text, in place of the checkpoint's
