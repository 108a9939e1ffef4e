"""benchmarks/fp8_near_ties.py on the CPU (qwen3-tiny, FP8 served from dequantized weights): every
variant compares every position, and the nudge reaches the FP8 products (it moves the gaps where
nothing else does: the CPU computes one request alike alone, chunked and in a batch)."""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.fp8_near_ties import run


def test_each_variant_compares_every_position_and_the_nudge_moves_the_gaps():
    args = argparse.Namespace(model="qwen3-tiny", device="cpu", prompts=2, prompt_len=40, tokens=5, batch=4)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 150_000, args.prompt_len).tolist() for _ in range(args.prompts)]
    fp8 = run("fp8", args, prompts)
    assert set(fp8) == {"chunked", "batched", "nudged"}
    for variant in fp8.values():
        assert variant["positions"] == args.prompts * (args.tokens + 1)
    assert fp8["chunked"]["shift_max"] == 0.0 and fp8["batched"]["shift_max"] == 0.0
    assert fp8["nudged"]["shift_max"] > 0.0
    assert set(run(None, args, prompts)) == {"chunked", "batched"}
