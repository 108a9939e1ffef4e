"""One batch end to end through the multiprocess system, without HTTP: launch, serve, report.

    python -m benchmarks.system_batch --model qwen3-14b --load-format dummy --dp 2 \\
        --num-prompts 64 --input-len 512 --output-len 128 --out batch.json

Starts the launcher with the engine flags, submits every prompt at once through a native DEALER
(random token ids of exactly --input-len, ignore_eos so each yields exactly --output-len tokens),
and reports wall time, token throughput, TTFT and TPOT, and steps per second of each replica.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from core.sampling_params import SamplingParams
from ipc.channels import DealerChannel
from ipc.messages import GenerateRequest, OutputDelta, RequestFailed, ServerInfo, ServerInfoQuery
from procs.args import add_engine_args, config_from_args, launch_options_from_args
from procs.launcher import Launcher


def _info(channel: DealerChannel) -> ServerInfo:
    channel.send(ServerInfoQuery())
    while not isinstance(msg := channel.expect(10), ServerInfo):
        pass
    return msg


def run(args: argparse.Namespace) -> dict:
    config = config_from_args(args)
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(0, 150_000, (args.num_prompts, args.input_len)).tolist()
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    with Launcher(config, launch_options_from_args(args)) as launcher:
        startup_s = time.perf_counter() - started
        channel = DealerChannel.connect(launcher.endpoints.tokenizer_frontend, name="benchmark client")
        time.sleep(0.3)  # one scheduler report, so the step counters below start from now
        steps_before = [r.stats.step_id for r in _info(channel).replicas]
        sent_s = time.perf_counter()
        for i, prompt in enumerate(prompts):
            channel.send(GenerateRequest(f"b{i}", params, prompt_token_ids=prompt, detokenize=False))
        first_s, last_s, num_tokens, errors = {}, {}, {}, []
        while len(last_s) + len(errors) < len(prompts):
            msg = channel.expect(args.step_timeout)
            now = time.perf_counter()
            if isinstance(msg, RequestFailed):
                errors.append(msg.message)
            elif isinstance(msg, OutputDelta):
                first_s.setdefault(msg.request_id, now)
                num_tokens[msg.request_id] = msg.num_output_tokens
                if msg.finished:
                    last_s[msg.request_id] = now
                    if msg.error:
                        errors.append(msg.error)
        wall_s = time.perf_counter() - sent_s
        time.sleep(0.3)
        replicas = _info(channel).replicas
        channel.close()
    ttft = np.array([first_s[k] - sent_s for k in first_s]) * 1e3
    tpot = np.array([(last_s[k] - first_s[k]) / max(num_tokens[k] - 1, 1) for k in last_s]) * 1e3
    output_tokens = sum(num_tokens.values())
    return {
        "model": config.model.name, "dp": config.parallel.dp_size, "tp": config.parallel.tp_size,
        "device": config.device, "dtype": config.model.dtype, "num_prompts": args.num_prompts,
        "input_len": args.input_len, "output_len": args.output_len, "errors": errors[:5],
        "num_errors": len(errors), "startup_s": startup_s, "wall_s": wall_s,
        "output_tok_per_s": output_tokens / wall_s,
        "total_tok_per_s": (output_tokens + args.input_len * len(last_s)) / wall_s,
        "ttft_ms_median": float(np.median(ttft)), "ttft_ms_max": float(ttft.max()),
        "tpot_ms_median": float(np.median(tpot)),
        "steps_per_s": [(r.stats.step_id - b) / wall_s for r, b in zip(replicas, steps_before) if r.stats],
        "kv_pages": [r.num_pages for r in replicas],
        "prefix_cache_hit_tokens": [r.stats.prefix_cache_hit_tokens for r in replicas if r.stats],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.system_batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(parser)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
