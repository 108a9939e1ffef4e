"""How far greedy logprob gaps move between computations that are all correct, in FP8 and in bf16:
what the generalization matrix's near-tie tolerance (benchmarks/generalization/compare.py) has to
accept.

    python -m benchmarks.fp8_near_ties --out near_ties.json [--prompts 8 --prompt-len 1000 --tokens 64]

The matrix calls a greedy divergence between two runs acceptable when, in both, both tokens lie
within `tie_nats` of the best logprob (bf16 0.35; FP8 first 1.2, under which the FP8 matrix
failed six cells on one token each, 1.22-2.06 nats apart, while the bf16 one passed; 3.0 since
this measurement). This measures, on the 14B shape with
dummy weights, the ModelRunner alone (no server, eager, the served GEMMs), what a correct change of
the computation does to the gaps: `--prompts` random prompts of `--prompt-len` tokens, each
prefilled whole and decoded greedily for `--tokens` tokens (baseline), then every variant fed the
baseline's tokens (teacher-forced, so every position compares):

  chunked  the prompt prefilled 16 tokens a step, as the matrix's chunked-prefill cell does;
  batched  all prompts in one prefill step, then decoded with fillers to `--batch` rows a step
           (other GEMM row counts, hence other cuBLAS kernels, as in the batch and async cells);
  nudged   (FP8 only) every FP8 product's output times 1 + 2**-9 * a standard normal draw before
           its rounding to bf16: a last-bit change of some outputs, nothing else.

Per variant, over every position: the shift of the baseline's top-2..20 gaps (|gap in the baseline -
gap in the variant|, the largest of the 19, in nats), and the argmax flips with the gap each run saw
between the two tokens (the larger of the two is what the matrix compares with `tie_nats`).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.model.fp8_linear import Fp8LinearMethod
from core.execution.runner import ModelRunner
from core.plan import StepPlan
from core.sampling_params import sampling_rows

BLOCK_SIZE = 16
CHUNK = 16  # the matrix's chunked-prefill budget
TOP = 20
NUDGE = 2.0 ** -9
FILLER_LEN = 64


def plan(chunks: list[tuple[list[int], int, list[int], bool]], step_id: int = 0) -> StepPlan:
    """chunks: (token ids, first position, pages, sample)."""
    lens = [len(ids) for ids, _, _, _ in chunks]
    query_start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    block_table = np.zeros((len(chunks), max(len(p) for _, _, p, _ in chunks)), np.int32)
    positions, slots = [], []
    for i, (ids, start, pages, _) in enumerate(chunks):
        block_table[i, :len(pages)] = pages
        pos = np.arange(start, start + len(ids))
        positions.append(pos)
        slots.append(np.asarray(pages)[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
    return StepPlan(
        step_id=step_id, replica=0, query_start=query_start,
        seq_lens=np.asarray([start + len(ids) for ids, start, _, _ in chunks], np.int32),
        block_table=block_table,
        logits_index=np.asarray([query_start[i + 1] - 1 if sample else -1
                                 for i, (_, _, _, sample) in enumerate(chunks)], np.int32),
        sampling=sampling_rows(len(chunks), temperature=0.0), output_pos=np.zeros(len(chunks), np.int32),
        input_ids=np.concatenate([np.asarray(ids, np.int32) for ids, _, _, _ in chunks]),
        positions=np.concatenate(positions).astype(np.int32), kv_index=np.concatenate(slots).astype(np.int64))


def pages_per_row(prompt_len: int, tokens: int) -> int:
    return -(-(max(prompt_len, FILLER_LEN) + tokens + 1) // BLOCK_SIZE)


class Probe:
    def __init__(self, runner: ModelRunner, prompts: list[list[int]], tokens: int, batch: int, rng) -> None:
        self.runner, self.prompts, self.tokens = runner, prompts, tokens
        pages_each = pages_per_row(len(prompts[0]), tokens)
        self.pages = [list(range(i * pages_each, (i + 1) * pages_each)) for i in range(batch)]
        self.fillers = [rng.integers(0, 150_000, FILLER_LEN).tolist() for _ in range(batch - len(prompts))]

    def logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float(), dim=-1)

    def alone(self, i: int, forced: list[int] | None, chunk: int | None = None) -> torch.Tensor:
        """[tokens + 1, vocab] logprobs of prompt i alone; greedy unless `forced`."""
        prompt, pages, rows = self.prompts[i], self.pages[i], []
        step = chunk or len(prompt)
        for start in range(0, len(prompt), step):
            last = start + step >= len(prompt)
            logits, _ = self.runner.forward_logits(plan([(prompt[start:start + step], start, pages, last)]))
        rows.append(self.logprobs(logits[0]))
        for t in range(self.tokens):
            token = forced[t] if forced is not None else int(rows[-1].argmax())
            logits, _ = self.runner.forward_logits(plan([([token], len(prompt) + t, pages, True)], t + 1))
            rows.append(self.logprobs(logits[0]))
        return torch.stack(rows)

    def batched(self, forced: list[list[int]]) -> list[torch.Tensor]:
        """Every prompt in one prefill, then decode steps of all of them and the fillers."""
        n = len(self.prompts)
        seqs = self.prompts + self.fillers
        prefill = [(s, 0, self.pages[i], True) for i, s in enumerate(seqs)]
        logits, _ = self.runner.forward_logits(plan(prefill))
        rows = [[self.logprobs(logits[i])] for i in range(n)]
        filler_next = [int(logits[i].argmax()) for i in range(n, len(seqs))]
        for t in range(self.tokens):
            chunks = [([forced[i][t]], len(self.prompts[i]) + t, self.pages[i], True) for i in range(n)]
            chunks += [([token], FILLER_LEN + t, self.pages[n + j], True)
                       for j, token in enumerate(filler_next)]
            logits, _ = self.runner.forward_logits(plan(chunks, t + 1))
            for i in range(n):
                rows[i].append(self.logprobs(logits[i]))
            filler_next = [int(logits[n + j].argmax()) for j in range(len(self.fillers))]
        return [torch.stack(r) for r in rows]


def compare(base: torch.Tensor, other: torch.Tensor) -> tuple[list[float], list[dict]]:
    """Per position the largest shift of the baseline's top gaps; the flips with both runs' gaps."""
    top = base.topk(TOP, dim=-1).indices  # [P, TOP], best first
    gap_base = base.gather(1, top[:, :1]) - base.gather(1, top[:, 1:])
    gap_other = other.gather(1, top[:, :1]) - other.gather(1, top[:, 1:])
    shifts = (gap_base - gap_other).abs().max(dim=1).values.tolist()
    flips = []
    for p in torch.nonzero(other.argmax(-1) != top[:, 0]).flatten().tolist():
        a, b = int(top[p, 0]), int(other[p].argmax())
        flips.append({"position": p, "baseline_gap": float(base[p, a] - base[p, b]),
                      "variant_gap": float(other[p, b] - other[p, a])})
    return shifts, flips


def nudge_fp8_products(runner: ModelRunner, seed: int) -> None:
    generator = torch.Generator(device=runner.config.device).manual_seed(seed)
    methods = {id(m.linear_method): m.linear_method for m in runner.model.modules()
               if isinstance(getattr(m, "linear_method", None), Fp8LinearMethod)}
    for method in methods.values():
        def nudged(x, weight, scale_inv, gemm=method.gemm):
            out = gemm(x, weight, scale_inv)
            noise = torch.randn(out.shape, generator=generator, device=out.device)
            return (out.float() * (1 + NUDGE * noise)).to(out.dtype)
        method.gemm = nudged


def run(quantization: str | None, args, prompts: list[list[int]]) -> dict:
    model = ModelConfig.from_name(args.model, dtype="bfloat16", load_format="dummy")
    if quantization:
        model = model.quantized_at_load(quantization)
    pages = args.batch * pages_per_row(args.prompt_len, args.tokens)
    step_tokens = max(8192, args.prompt_len * len(prompts) + FILLER_LEN * args.batch)
    config = EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE),
                          scheduler=SchedulerConfig(max_num_batched_tokens=step_tokens,
                                                    max_num_seqs=args.batch),
                          device=args.device, enforce_eager=True)
    runner = ModelRunner(config, num_pages=pages, show_progress=False)
    probe = Probe(runner, prompts, args.tokens, args.batch, np.random.default_rng(1))
    base = [probe.alone(i, None) for i in range(len(prompts))]
    forced = [b.argmax(-1)[:-1].tolist() for b in base]
    variants = {"chunked": [probe.alone(i, forced[i], CHUNK) for i in range(len(prompts))],
                "batched": probe.batched(forced)}
    if quantization:
        nudge_fp8_products(runner, seed=7)
        variants["nudged"] = [probe.alone(i, forced[i]) for i in range(len(prompts))]
    result = {}
    for name, runs in variants.items():
        shifts, flips = [], []
        for b, v in zip(base, runs):
            s, f = compare(b, v)
            shifts += s
            flips += f
        matrix_gaps = sorted((max(f["baseline_gap"], f["variant_gap"]) for f in flips), reverse=True)
        result[name] = {"positions": len(shifts), "shift_median": float(np.median(shifts)),
                        "shift_p99": float(np.percentile(shifts, 99)), "shift_max": float(max(shifts)),
                        "flips": len(flips), "flip_gaps_largest": matrix_gaps[:10], "flip_detail": flips}
        print(f"{quantization or 'bf16':5s} {name:8s} {len(shifts)} positions: top-gap shift median "
              f"{result[name]['shift_median']:.3f}, p99 {result[name]['shift_p99']:.3f}, max "
              f"{result[name]['shift_max']:.3f} nats; {len(flips)} flips, largest gaps "
              f"{[round(g, 2) for g in matrix_gaps[:6]]}", flush=True)
    del runner, probe
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-14b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64,
                        help="rows of a batched decode step, fillers included")
    parser.add_argument("--quantizations", default="fp8,bf16")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    assert args.batch >= args.prompts
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 150_000, args.prompt_len).tolist() for _ in range(args.prompts)]
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    results = {"device": device, "torch": torch.__version__, "args": vars(args)}
    for name in args.quantizations.split(","):
        results[name] = run(None if name == "bf16" else name, args, prompts)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
