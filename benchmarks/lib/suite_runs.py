"""The performance suite's single-card runs: each a server setting, a load and its prompt count.

benchmarks/suite.py starts the servers and runs the load tool; benchmarks/lib/layout_runs.py holds
the runs on several cards. A run's prompts are seeded by its place in SINGLE_CARD_RUNS, so new runs
go last.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

RANDOM = ["--dataset", "random", "--input-len", "1784", "--output-len", "256"]
# Decode-bound: 1,024-token prompts that c128_warm has put in the prefix cache, 256 tokens out.
CACHED = ["--dataset", "random", "--input-len", "1024", "--output-len", "256", "--max-concurrency", "128"]
SHARED = [
    "--dataset",
    "shared-prefix",
    "--groups",
    "64",
    "--prompts-per-group",
    "16",
    "--system-len",
    "2048",
    "--question-len",
    "128",
    "--output-len",
    "256",
]
# Every group's prompts arrive before any of them is cached: what the DP router must keep together.
SHARED_BURST = ["--dataset", "shared-prefix", "--groups", "32", "--prompts-per-group", "16", "--system-len",
                "2048", "--question-len", "128", "--output-len", "64", "--max-concurrency", "128"]
FP8 = ("--quantization", "fp8")
SMALL_STEP_GRAPHS = ("--small-step-graphs",)
FP8_KV = ("--kv-cache-dtype", "fp8")
SHORT = ["--dataset", "random", "--input-len", "48", "--output-len", "64", "--max-concurrency", "1"]
# Every reply in JSON mode: the structured-output masks on the host while the GPU runs the forward.
JSON_MODE = ("--extra-body", json.dumps({"response_format": {"type": "json_object"}}))
PEER_WORKLOAD = ["--dataset", "random", "--input-len", "512", "--output-len", "128", "--num-prompts", "256"]


@dataclass(frozen=True)
class Run:
    key: str
    server_flags: tuple[str, ...]  # beyond --model/--load-format
    load_flags: tuple[str, ...]
    num_prompts: int  # before --scale
    prompts_of: str = ""  # another run whose prompts (seed) this one repeats, for a like-for-like pair
    # A run repeating prompts the running server has seen gets a fresh server unless it means to
    # find them cached (c1_fp8_defaults after c1_fp8 had found 99.6 % of its prompt tokens cached).
    expects_cache_hits: bool = False
    one_card: bool = False  # the server sees only the first visible card (DP replicas sharing it)


SINGLE_CARD_RUNS = {
    "chat": Run("chat", (), ("--dataset", "multi-turn", "--conversations", "1", "--turns", "2",
                             "--output-len", "128"), 2),
    "c1": Run("c1", (), (*RANDOM, "--max-concurrency", "1"), 16),
    "c16": Run("c16", (), (*RANDOM, "--max-concurrency", "16"), 128),
    "c64": Run("c64", (), (*RANDOM, "--max-concurrency", "64"), 320),
    "c302": Run("c302", (), (*RANDOM, "--max-concurrency", "302"), 1000),
    "prefix_on": Run("prefix_on", (), (*SHARED, "--max-concurrency", "256"), 1024),
    "prefix_off": Run(
        "prefix_off", ("--no-enable-prefix-caching",), (*SHARED, "--max-concurrency", "256"), 1024
    ),
    # Two replicas on one card only show the router and the replicas' overhead (DP is for several
    # cards): half of c302's prompts keep the run short.
    "dp2": Run("dp2", ("--dp", "2"), (*RANDOM, "--max-concurrency", "302"), 500, one_card=True),
    "prefix_burst_dp1": Run("prefix_burst_dp1", (), tuple(SHARED_BURST), 512),
    "prefix_burst_dp2": Run("prefix_burst_dp2", ("--dp", "2"), tuple(SHARED_BURST), 512, "prefix_burst_dp1",
                            one_card=True),
    "peer_cadence": Run("peer_cadence", (), PEER_WORKLOAD, 256),
    # The same prompts as c1 and c302, one step at a time (each on a server of its own).
    "c1_sync": Run("c1_sync", ("--no-async-scheduling",), (*RANDOM, "--max-concurrency", "1"), 16, "c1"),
    "prefix_on_sync": Run("prefix_on_sync", ("--no-async-scheduling",), (*SHARED, "--max-concurrency", "256"),
                          1024, "prefix_on"),
    "c302_sync": Run("c302_sync", ("--no-async-scheduling",), (*RANDOM, "--max-concurrency", "302"), 1000,
                     "c302"),
    # The same prompts sampled as users do: no sampling field, so the server applies the checkpoint's
    # generation_config (Qwen3: temperature 0.6, top_p 0.95, top_k 20).
    "c1_defaults": Run("c1_defaults", (), (*RANDOM, "--max-concurrency", "1", "--sampling", "model-defaults"),
                       16, "c1"),
    "c302_defaults": Run("c302_defaults", (), (*RANDOM, "--max-concurrency", "302", "--sampling",
                                               "model-defaults"), 1000, "c302"),
    # The sampler's cost where decode dominates: the same cached prompts, greedy and at the defaults.
    "c128_warm": Run("c128_warm", (), tuple(CACHED), 256),
    "c128_cached": Run("c128_cached", (), tuple(CACHED), 256, "c128_warm", expects_cache_hits=True),
    "c128_cached_defaults": Run("c128_cached_defaults", (), (*CACHED, "--sampling", "model-defaults"), 256,
                                "c128_warm", expects_cache_hits=True),
    # The same prompts served in FP8 (weights quantized at load), beside their bf16 runs.
    "c1_fp8": Run("c1_fp8", FP8, (*RANDOM, "--max-concurrency", "1"), 16, "c1"),
    "c302_fp8": Run("c302_fp8", FP8, (*RANDOM, "--max-concurrency", "302"), 1000, "c302"),
    "prefix_on_fp8": Run("prefix_on_fp8", FP8, (*SHARED, "--max-concurrency", "256"), 1024, "prefix_on"),
    "peer_cadence_fp8": Run("peer_cadence_fp8", FP8, PEER_WORKLOAD, 256, "peer_cadence"),
    "c1_fp8_defaults": Run("c1_fp8_defaults", FP8, (*RANDOM, "--max-concurrency", "1", "--sampling",
                                                    "model-defaults"), 16, "c1"),
    "c302_fp8_defaults": Run("c302_fp8_defaults", FP8, (*RANDOM, "--max-concurrency", "302", "--sampling",
                                                        "model-defaults"), 1000, "c302"),
    # New runs go last: a run's prompts are seeded by its place here.
    # The burst pair in FP8: on an 80 GB card two bf16 replicas leave each ~3 GB of KV cache, too
    # little for the burst's working set, so the pair would measure eviction, not routing.
    "prefix_burst_dp1_fp8": Run("prefix_burst_dp1_fp8", FP8, tuple(SHARED_BURST), 512, "prefix_burst_dp1"),
    "prefix_burst_dp2_fp8": Run("prefix_burst_dp2_fp8", (*FP8, "--dp", "2"), tuple(SHARED_BURST), 512,
                                "prefix_burst_dp1", one_card=True),
    # Short prompts one at a time, whose first token waits on the host's launch of an eager step,
    # with and without the decode graphs replaying such steps (core/execution/token_rows.py).
    "c1_short": Run("c1_short", (), tuple(SHORT), 64),
    "c1_short_graphs": Run("c1_short_graphs", SMALL_STEP_GRAPHS, tuple(SHORT), 64, "c1_short"),
    "c1_short_fp8": Run("c1_short_fp8", FP8, tuple(SHORT), 64, "c1_short"),
    "c1_short_fp8_graphs": Run("c1_short_fp8_graphs", (*FP8, *SMALL_STEP_GRAPHS), tuple(SHORT), 64,
                               "c1_short"),
    # FP8 weights and an fp8 KV cache: half the K/V bytes a decode step reads (core/execution/kv_cache.py).
    "c1_fp8_kvfp8": Run("c1_fp8_kvfp8", (*FP8, *FP8_KV), (*RANDOM, "--max-concurrency", "1"), 16, "c1"),
    "c302_fp8_kvfp8": Run("c302_fp8_kvfp8", (*FP8, *FP8_KV), (*RANDOM, "--max-concurrency", "302"), 1000,
                          "c302"),
    # c1 and c64's prompts with every reply in JSON mode (response_format json_object): the host
    # works out each row's mask while the GPU runs the forward, and such a step samples eagerly.
    "c1_json": Run("c1_json", (), (*RANDOM, "--max-concurrency", "1", *JSON_MODE), 16, "c1"),
    "c64_json": Run("c64_json", (), (*RANDOM, "--max-concurrency", "64", *JSON_MODE), 320, "c64"),
    # A few concurrent users: decode steps of 2-4 rows, between the row GEMV's one and cuBLAS's many.
    "c4": Run("c4", (), (*RANDOM, "--max-concurrency", "4"), 32),
    "c4_fp8": Run("c4_fp8", FP8, (*RANDOM, "--max-concurrency", "4"), 32, "c4"),
}
