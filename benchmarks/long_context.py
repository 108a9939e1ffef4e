"""One prompt at the model's whole context, served through the engine's processes.

    python -m benchmarks.long_context --model qwen3-14b --out long_context.json -- \
        --load-format dummy --quantization fp8 --max-model-len 131072 \
        --hf-overrides '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 32768}}'

What Qwen3's YaRN setting promises is a context of 131,072 tokens; this checks a server gives it:

  fresh     a prompt of the context less `--max-tokens`, prefilled in chunks and decoded to its end;
  cached    the same prompt again: its pages come from the radix cache, and with greedy decoding the
            tokens should be the fresh run's (reported, not asserted: the cached run computes its
            last chunk alone, which may round a near-tie the other way on random weights);
  branched  the prompt with its last `--branch-tokens` changed: the common prefix is cached;
  too_long  one token past the context: refused with a message, the engine still serving.

Each row records its time to the first token and its wall time (streamed through the native
client), the tokens cached and whether every logprob is finite. Flags after `--` are `cadence
serve`'s engine flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

import numpy as np

from api.client_errors import RequestRefused
from api.generation import Generation, GenerationBuilder
from api.offline import LLM
from core.sampling_params import SamplingParams


def _served(llm: LLM, name: str, prompt: list[int], params: SamplingParams) -> dict:
    """One request streamed through the native client: its row, with the time to its first token."""
    started = time.perf_counter()
    first_token_s = None
    builder = None
    try:
        for delta in llm.client.stream(prompt, params, timeout_s=llm.timeout_s):
            builder = builder or GenerationBuilder(delta.request_id)
            if first_token_s is None and delta.token_ids:
                first_token_s = time.perf_counter() - started
            builder.add(delta)
        generation = builder.build() if builder is not None else Generation("none", error="no output")
    except RequestRefused as refused:
        generation = Generation(refused.failure.request_id, refused=refused.failure)
    logprobs = generation.logprobs or []
    return {
        "name": name,
        "prompt_tokens": len(prompt),
        "ok": generation.ok,
        "refused": None if generation.refused is None else generation.refused.message,
        "error": generation.error,
        "finish_reason": generation.finish_reason,
        "cached_tokens": generation.num_cached_tokens,
        "output_tokens": generation.num_output_tokens,
        "logprobs_finite": bool(logprobs) and all(math.isfinite(v) for v in logprobs),
        "ttft_s": None if first_token_s is None else round(first_token_s, 3),
        "wall_s": round(time.perf_counter() - started, 3),
        "token_ids": generation.token_ids,
    }


def run(model: str, engine_flags: list[str], context: int, max_tokens: int, branch_tokens: int,
        seed: int) -> dict:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1_000, 100_000, size=context - max_tokens).tolist()
    branched = prompt[:-branch_tokens] + rng.integers(1_000, 100_000, size=branch_tokens).tolist()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)
    rows = []
    started = time.perf_counter()
    with LLM(model, *engine_flags, "--max-model-len", str(context), timeout_s=1_200.0) as llm:
        start_s = time.perf_counter() - started
        for name, tokens, limit in (("fresh", prompt, max_tokens), ("cached", prompt, max_tokens),
                                    ("branched", branched, max_tokens), ("too_long", prompt, max_tokens + 1)):
            rows.append(_served(llm, name, tokens, dataclasses.replace(params, max_tokens=limit)))
            shown = {k: v for k, v in rows[-1].items() if k != "token_ids"}
            print(f"{name}: {json.dumps(shown)}", flush=True)
        [after] = llm.generate([prompt[:64]], SamplingParams(max_tokens=8, temperature=0.0))
    fresh, cached = rows[0], rows[1]
    return {
        "model": model,
        "engine_flags": engine_flags,
        "context": context,
        "start_s": round(start_s, 1),
        "rows": rows,
        "cached_tokens_equal_fresh": fresh["token_ids"] == cached["token_ids"],
        "serving_after_refusal": after.ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3-14b")
    parser.add_argument("--context", type=int, default=131_072, help="the --max-model-len to serve")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--branch-tokens", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    parser.add_argument("engine_flags", nargs=argparse.REMAINDER,
                        help="after --: cadence serve's engine flags")
    args = parser.parse_args()
    flags = args.engine_flags[1:] if args.engine_flags[:1] == ["--"] else args.engine_flags
    result = run(args.model, flags, args.context, args.max_tokens, args.branch_tokens, args.seed)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    summary = {k: v for k, v in result.items() if k != "rows"}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
