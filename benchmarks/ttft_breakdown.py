"""Where a request's time to first token goes, across the server's processes.

    CADENCE_LOG_LEVEL=DEBUG cadence serve ... > server.log 2>&1 &
    python -m benchmarks.load ... --max-concurrency 1 --out load.json
    python -m benchmarks.ttft_breakdown --log server.log --load load.json

The load's requests carry their send time on CLOCK_MONOTONIC (`sent_monotonic_s`), the clock of the
scheduler's step trace (procs/step_trace.py), so one request splits into:

  to_scheduler  the client's send to the scheduler's routing (HTTP, the API, tokenization, IPC);
  to_plan       routing to the first step with its prompt tokens being sent to the executor;
  step          that step sent to its result back at the scheduler (the executor's `executed` beside);
  to_client     the result back to the first token at the client (detokenization, the stream);
  host          all of the TTFT but the executor's own time for the step (`executed`): the server's
                share, which the processes and hops cost.

Meant for concurrency 1, where each request's first step is its prefill alone; a prompt prefilled
in chunks counts its last chunk's step.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics

ARRIVED = re.compile(r"request (\S+) on replica (\d+) at ([\d.]+): (\d+) prompt tokens, (\d+) cached")
SENT = re.compile(r"replica (\d+) step (\d+) sent at ([\d.]+): (\d+) requests, (\d+) tokens")
DONE = re.compile(r"replica (\d+) step (\d+) done at ([\d.]+): executed ([\d.?]+) ms")
PHASES = ("to_scheduler", "to_plan", "step", "to_client")


def read_trace(lines) -> tuple[list[tuple[float, int]], dict, dict]:
    """(arrivals [(time, uncached prompt tokens)], steps sent {(replica, id): (time, tokens)},
    steps done {(replica, id): (time, executed ms or None)})."""
    arrivals, sent, done = [], {}, {}
    for line in lines:
        if m := ARRIVED.search(line):
            arrivals.append((float(m[3]), int(m[4]) - int(m[5])))
        elif m := SENT.search(line):
            sent[(int(m[1]), int(m[2]))] = (float(m[3]), int(m[5]))
        elif m := DONE.search(line):
            done[(int(m[1]), int(m[2]))] = (float(m[3]), None if m[4] == "?" else float(m[4]))
    return sorted(arrivals), sent, done


def breakdown(requests: list[dict], arrivals, sent: dict, done: dict) -> list[dict]:
    """Each request's phases in ms: the arrival after its send, the last step before its first token
    that carried at least its uncached prompt's last token."""
    rows = []
    for request in sorted(requests, key=lambda r: r["sent_monotonic_s"]):
        if request.get("ttft_ms") is None:
            continue
        sent_at = request["sent_monotonic_s"]
        first_token = sent_at + request["ttft_ms"] / 1e3
        arrival = next((a for a in arrivals if sent_at <= a[0] <= first_token), None)
        if arrival is None:
            continue
        steps = [(t_sent, key) for key, (t_sent, tokens) in sent.items()
                 if arrival[0] <= t_sent and tokens > 1 and key in done and done[key][0] <= first_token]
        if not steps:
            continue
        step_sent, key = max(steps)
        step_done, executed = done[key]
        rows.append({"to_scheduler": (arrival[0] - sent_at) * 1e3, "to_plan": (step_sent - arrival[0]) * 1e3,
                     "step": (step_done - step_sent) * 1e3, "to_client": (first_token - step_done) * 1e3,
                     "executed": executed, "ttft": request["ttft_ms"],
                     "host": None if executed is None else request["ttft_ms"] - executed})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, help="the server's output at DEBUG")
    parser.add_argument("--load", required=True, help="benchmarks.load's --out JSON")
    parser.add_argument("--out", help="write the rows and medians as JSON here")
    args = parser.parse_args()
    with open(args.log) as f:
        arrivals, sent, done = read_trace(f)
    with open(args.load) as f:
        requests = json.load(f)["requests"]
    rows = breakdown(requests, arrivals, sent, done)
    if not rows:
        raise SystemExit("no request matched the trace (was the server at DEBUG, the load's clock the same?)")
    medians = {k: statistics.median(r[k] for r in rows if r[k] is not None)
               for k in (*PHASES, "executed", "ttft", "host") if any(r[k] is not None for r in rows)}
    print(f"{len(rows)} requests, medians (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"medians_ms": medians, "requests": rows}, f, indent=2)


if __name__ == "__main__":
    main()
