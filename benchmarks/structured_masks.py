"""What structured outputs cost the host per step: rank 0 works out every constrained row's mask
while the GPU runs the step's forward, so this time must stay under the forward's to cost nothing.

    python -m benchmarks.structured_masks [--batch-sizes 1,16,64,256] [--steps 64] [--specs pattern]

Over the real Qwen vocabulary: B requests of one spec decode together, each drawing its next token
at random among those its mask allows (closing tokens preferred, so outputs end and start over);
every step times `StructuredRows.masks` for the whole batch, as the executor calls it. Cold: the
first pass over a spec (the mask caches empty); warm: the same spec again with other draws (the
caches keep what the cold pass computed, new states still miss). Also the one-time cost of
indexing the vocabulary. Prints a table (and, with --out, writes JSON).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from core.execution.structured_rows import StructuredRows
from core.plan import StepPlan
from core.structured.specs import (
    choice_spec,
    grammar_spec,
    json_object_spec,
    json_schema_spec,
    tool_calls_spec,
)
from core.structured.token_masks import TokenMasks, Vocabulary, unpack
from core.tokenizer.qwen_vocab import QwenVocabTokenizer

WIDTH = 151936
PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"]},
    "status": {"enum": ["active", "inactive", "banned"]}}, "required": ["name", "age", "status"]}
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}
SPECS = {"json_schema": json_schema_spec(PERSON), "json_object": json_object_spec(),
         "json_object+thinking": json_object_spec(reasoning=True),
         "tool_calls": tool_calls_spec([WEATHER], max_calls=4),
         "choice": choice_spec(["yes", "no", "unsure"]),
         # broad counted patterns: every character position a new state whose mask walks most of
         # the vocabulary the first time
         "pattern": json_schema_spec({"type": "object", "properties": {
             "summary": {"type": "string", "pattern": "^[a-z ]{1,64}$"},
             "code": {"type": "string", "pattern": r"^[A-Z]{3}-\d{4}$"}}, "required": ["summary", "code"]}),
         # GBNF grammars (guided_grammar): vLLM's structured-output benchmark's SQL grammar, and a
         # recursive one (nested arrays of numbers and words: rule calls on the automaton's stacks)
         "sql": grammar_spec('root ::= "SELECT " column " from " table " where " column "= " number\n'
                             'column ::= "col_1 " | "col_2 "\ntable ::= "table_1 " | "table_2 "\n'
                             'number ::= "1 " | "2 "'),
         "grammar": grammar_spec('root ::= "[" ws (item ("," ws item)*)? "]"\n'
                                 'item ::= "0" | [1-9] [0-9]{0,5} | "\\"" [a-z ]* "\\"" | root\n'
                                 'ws ::= " "?')}


def step_plan(spec: bytes, outputs: list[list[int]], prompt_len: int = 32) -> StepPlan:
    """A decode step of len(outputs) requests with `spec`, their outputs so far as history."""
    b = len(outputs)
    lengths = [prompt_len + len(output) for output in outputs]
    history = np.concatenate([np.concatenate([np.full(prompt_len, 9, np.int32), np.asarray(o, np.int32)])
                              for o in outputs])
    encoded = np.frombuffer(spec, np.uint8)
    return StepPlan(
        step_id=0, replica=0, query_start=np.arange(b + 1, dtype=np.int32), seq_lens=np.ones(b, np.int32),
        block_table=np.zeros((b, 1), np.int32), logits_index=np.arange(b, dtype=np.int32),
        output_pos=np.array([len(o) for o in outputs], np.int32),
        history_start=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        history_prompt_len=np.full(b, prompt_len, np.int32), history_ids=history,
        grammar_start=(np.arange(b + 1) * len(encoded)).astype(np.int32), grammar_spec=np.tile(encoded, b),
        input_ids=np.zeros(b, np.int32), positions=np.zeros(b, np.int32), kv_index=np.zeros(b, np.int64))


def run_batch(rows: StructuredRows, spec: str, batch: int, steps: int, seed: int) -> list[float]:
    """Milliseconds of each step's masks for `batch` requests decoding `spec` together."""
    rng = np.random.default_rng(seed)
    vocabulary = rows.token_masks.vocabulary
    closers = np.zeros(vocabulary.width, bool)
    closers[[i for i, data in enumerate(vocabulary.token_bytes) if any(b in data for b in b'"]}>')]] = True
    outputs: list[list[int]] = [[] for _ in range(batch)]
    times = []
    encoded = spec.encode()
    for _ in range(steps):
        plan = step_plan(encoded, outputs)
        started = time.perf_counter()
        _, packed = rows.masks(plan, np.arange(batch), lambda: np.zeros(batch, np.int32))
        times.append((time.perf_counter() - started) * 1e3)
        for i in range(batch):
            allowed = np.flatnonzero(unpack(packed[i], vocabulary.width))
            if np.isin(allowed, vocabulary.end_ids).any():
                outputs[i] = []  # done: a new request takes the row
                continue
            closing = allowed[closers[allowed]]
            pool = closing if len(closing) and rng.random() < 0.5 else allowed
            outputs[i].append(int(rng.choice(pool)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--specs", default=",".join(SPECS), help="of %(default)s")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    started = time.perf_counter()
    vocabulary = Vocabulary.of_tokenizer(QwenVocabTokenizer(), WIDTH)
    masks = TokenMasks(vocabulary)
    index_s = time.perf_counter() - started
    print(f"vocabulary of {len(vocabulary.sorted_bytes)} tokens loaded and indexed in {index_s:.2f} s "
          f"(once per executor, on its first structured output)")
    results = {"index_s": index_s, "runs": []}
    print(f"{'spec':22} {'batch':>5} {'pass':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'ms/row p50':>10}")
    for name in args.specs.split(","):
        spec = SPECS[name]
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for label in ("cold", "warm"):
                rows = StructuredRows(lambda: vocabulary)
                rows._masks = masks if label == "warm" else TokenMasks(vocabulary)
                times = run_batch(rows, spec, batch, args.steps, seed=batch + 1000 * (label == "warm"))
                if label == "cold":
                    masks = rows._masks  # the warm pass reuses what the cold one cached
                p50, p99 = np.percentile(times, [50, 99])
                print(f"{name:22} {batch:5d} {label:>5} {p50:8.2f} {p99:8.2f} {max(times):8.2f} "
                      f"{p50 / batch:10.3f}")
                results["runs"].append({"spec": name, "batch": batch, "pass": label, "p50_ms": p50,
                                        "p99_ms": p99, "max_ms": max(times), "steps": args.steps})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
