"""SchedulerStats: a snapshot of one replica's scheduler, for metrics, /health and the DP router;
SchedulerCounts: what the scheduler counts as it goes, the snapshot's running part."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class SchedulerCounts:
    num_preempted: int = 0  # waiting to be recomputed after a preemption
    # Prefix cache, counted once per request at its first admission (recomputes not included).
    prefix_cache_query_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    num_preemptions: int = 0  # since start
    num_tokens_last_step: int = 0
    num_prompt_tokens: int = 0  # prompt tokens of admitted requests, since start
    num_generation_tokens: int = 0  # tokens sampled, since start

    def as_dict(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


@dataclass(frozen=True)
class SchedulerStats:
    step_id: int  # steps scheduled so far
    num_running: int
    num_waiting: int  # includes the preempted ones
    kv_usage: float  # fraction of KV pages owned by requests (cached-only pages are reclaimable)
    num_free_pages: int
    num_cached_pages: int  # held only by the prefix cache
    # and SchedulerCounts' fields:
    num_preempted: int
    prefix_cache_query_tokens: int
    prefix_cache_hit_tokens: int
    num_preemptions: int
    num_tokens_last_step: int
    num_prompt_tokens: int
    num_generation_tokens: int

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hit_tokens / max(self.prefix_cache_query_tokens, 1)
