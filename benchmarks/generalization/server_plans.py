"""The servers of the generalization matrix (benchmarks/generalization/matrix.py describes each):
one EngineConfig and the cells it runs per server, the reference first, per subset.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from benchmarks.generalization.cell import Cell
from benchmarks.generalization.layout_cells import (
    chunked_cell,
    identical_prompts_cell,
    layout_cell,
    preemption_cell,
    preemption_pool,
    prefix_cache_cells,
)
from benchmarks.generalization.reference_cells import reference_cells
from benchmarks.generalization.workload import Workload
from core.config import ConfigError, EngineConfig, ParallelConfig

SERVER_NAMES = ("reference", "prefix-cache", "chunked", "preemption", "async", "async-preemption", "dp2",
                "tp2")
# The multi-gpu subset's servers: (dp, tp, async scheduling), every rank on a card of its own.
MULTI_GPU_LAYOUTS = {"dp2": (2, 1, False), "tp2": (1, 2, False), "tp2-async": (1, 2, True),
                     "dp4": (4, 1, False), "tp4": (1, 4, False), "dp2tp2": (2, 2, False),
                     "dp8": (8, 1, False), "tp8": (1, 8, False)}


@dataclass(frozen=True)
class ServerPlan:
    name: str
    config: EngineConfig
    cells: list[Cell]
    gpus: int = 0  # visible GPUs it needs, one per rank (the multi-gpu subset); 0: it runs anywhere
    refused: str = ""  # why the model cannot take this layout (its cells are not run), e.g. FP8 blocks


def layout_plan(name: str, reference: EngineConfig, parallel: ParallelConfig, cells: list[Cell],
                gpus: int = 0, async_scheduling: bool = False) -> ServerPlan:
    """The reference's settings on another layout; one the model refuses (a TP size that splits its
    heads or FP8 blocks) is a plan whose cells are not run, saying why."""
    try:
        config = replace(reference, parallel=parallel,
                         scheduler=replace(reference.scheduler, async_scheduling=async_scheduling))
    except ConfigError as exc:
        return ServerPlan(name, reference, cells, gpus, refused=f"not run: {exc}")
    return ServerPlan(name, config, cells, gpus)


def server_plans(base: EngineConfig, workload: Workload, chunk_budget: int,
                 subset: str = "cpu") -> list[ServerPlan]:
    """Every server configuration of the subset, reference first (the others compare against it)."""
    budget = max(base.scheduler.max_num_batched_tokens, base.max_model_len)
    reference = replace(base, parallel=ParallelConfig(tp_size=1, dp_size=1),
                        cache=replace(base.cache, enable_prefix_caching=False),
                        scheduler=replace(base.scheduler, enable_chunked_prefill=False,
                                          max_num_batched_tokens=budget, async_scheduling=False))
    cached = replace(reference, cache=replace(reference.cache, enable_prefix_caching=True))
    chunked = replace(reference, scheduler=replace(reference.scheduler, enable_chunked_prefill=True,
                                                   max_num_batched_tokens=chunk_budget))
    small_pool = replace(reference, cache=replace(base.cache, enable_prefix_caching=True,
                                                  num_pages=preemption_pool(workload)),
                         scheduler=replace(reference.scheduler, enable_chunked_prefill=True,
                                           max_num_batched_tokens=base.scheduler.max_num_batched_tokens))
    layout = "the probe and first batch prompts at once reproduce DP1 TP1's outputs"
    if subset == "multi-gpu":
        return [ServerPlan("reference", reference, reference_cells(workload)),
                *multi_gpu_plans(reference, layout)]
    return [
        ServerPlan("reference", reference, reference_cells(workload)),
        ServerPlan("prefix-cache", cached, prefix_cache_cells()),
        ServerPlan("chunked", chunked, [chunked_cell(chunk_budget)]),
        ServerPlan("preemption", small_pool, [preemption_cell(), identical_prompts_cell(8)]),
        ServerPlan("async", replace(reference, scheduler=replace(reference.scheduler,
                                                                 async_scheduling=True)),
                   [layout_cell("async scheduling", layout)]),
        ServerPlan("async-preemption",
                   replace(small_pool, scheduler=replace(small_pool.scheduler, async_scheduling=True)),
                   [preemption_cell("async scheduling, preemption (small pool)")]),
        layout_plan("dp2", reference, ParallelConfig(tp_size=1, dp_size=2),
                    [layout_cell("DP 2", layout + "; both replicas serve some")]),
        layout_plan("tp2", reference, ParallelConfig(tp_size=2, dp_size=1), [layout_cell("TP 2", layout)]),
    ]


def multi_gpu_plans(reference: EngineConfig, layout: str) -> list[ServerPlan]:
    """The layouts on cards of their own, on the reference's settings (async scheduling where named);
    a TP size the model's heads or FP8 blocks do not split into is a plan not run, saying why."""
    plans = []
    for name, (dp, tp, async_scheduling) in MULTI_GPU_LAYOUTS.items():
        words = " x ".join(w for w in (f"DP {dp}" if dp > 1 else "", f"TP {tp}" if tp > 1 else "") if w)
        words += ", async scheduling" if async_scheduling else ""
        checks = layout + ("; every replica serves some" if dp > 1 else "")
        plans.append(layout_plan(name, reference, ParallelConfig(tp_size=tp, dp_size=dp),
                                 [layout_cell(f"{words} on {dp * tp} GPUs", checks)], dp * tp,
                                 async_scheduling))
    return plans


def describe_config(config: EngineConfig) -> dict[str, object]:
    return {
        "model": config.model.name, "device": config.device, "dtype": config.model.dtype,
        "quantization": config.model.quantization,
        "dp": config.parallel.dp_size, "tp": config.parallel.tp_size, "block_size": config.cache.block_size,
        "num_pages": config.cache.num_pages, "prefix_caching": config.cache.enable_prefix_caching,
        "chunked_prefill": config.scheduler.enable_chunked_prefill,
        "max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
        "max_num_seqs": config.scheduler.max_num_seqs, "max_model_len": config.max_model_len,
        "async_scheduling": config.scheduler.async_scheduling, "max_logprobs": config.scheduler.max_logprobs,
    }
