"""SchedulerStats: a snapshot of one replica's scheduler, for metrics, /health and the DP router."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerStats:
    step_id: int  # steps scheduled so far
    num_running: int
    num_waiting: int  # includes the preempted ones
    num_preempted: int  # waiting to be recomputed after a preemption
    kv_usage: float  # fraction of KV pages owned by requests (cached-only pages are reclaimable)
    num_free_pages: int
    num_cached_pages: int  # held only by the prefix cache
    # Prefix cache, counted once per request at its first admission (recomputes not included).
    prefix_cache_query_tokens: int
    prefix_cache_hit_tokens: int
    num_preemptions: int  # since start
    num_tokens_last_step: int
    num_prompt_tokens: int  # prompt tokens of admitted requests, since start
    num_generation_tokens: int  # tokens sampled, since start

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hit_tokens / max(self.prefix_cache_query_tokens, 1)
