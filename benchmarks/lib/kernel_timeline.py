"""When the GPU idles inside one step: its kernels laid on a timeline, the gaps between them measured.

A step's wall time minus its kernels' sum says how much the GPU idled, not where. This profiles one
call with the host's operators and the GPU's kernels on one clock (torch.profiler) and reports:

  lead_ms       from the call's start (the first host operator) to the first kernel: the host's
                preparation before the GPU has anything to run;
  busy_ms       the union of the kernels' intervals;
  gaps          the idle intervals between kernels, counted by size, the largest with the kernels
                on either side and the host operators that were running when the next kernel was
                launched (what the GPU waited for);
  tail_ms       from the last kernel's end to the call's end (copies back, the host's finishing).

With programmatic dependent launch kernels overlap, so the union, not the sum, is the busy time.
"""

from __future__ import annotations

import gzip
import os
import shutil
from collections.abc import Callable

GAP_BUCKETS_US = (2, 5, 20, 100, 1000)  # a gap's size class: under 2 us, 2-5, 5-20, 20-100, 100-1000, above


Span = tuple[float, float, str]  # (start us, end us, name)


def _spans(events, kernels: bool) -> list[Span]:
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    out = []
    for e in events:
        start, end, name = e.time_range.start, e.time_range.end, e.name
        on_gpu = e.device_type == cuda
        if on_gpu != kernels:
            continue
        if kernels and (end <= start or "memcpy" in name.lower() or "memset" in name.lower()):
            continue
        out.append((start, end, name))
    return out


def summarize(kernels: list[Span], host: list[Span], top: int = 12) -> dict:
    """The timeline's figures from the kernels' and the host operators' spans (one clock, us)."""
    if not kernels or not host:
        return {"kernels": 0}
    kernels = sorted(kernels)
    call_start = min(s for s, _, _ in host)
    call_end = max(max(e for _, e, _ in host), max(e for _, e, _ in kernels))
    busy, gaps = 0.0, []
    run_start, run_end, _ = kernels[0]
    for (_, _, before), (start, end, name) in zip(kernels, kernels[1:], strict=False):
        if start > run_end:
            busy += run_end - run_start
            gaps.append((start - run_end, before, name, run_end, start))
            run_start = start
        run_end = max(run_end, end)
    busy += run_end - run_start
    labels = [f"<{b}us" for b in GAP_BUCKETS_US] + [f">={GAP_BUCKETS_US[-1]}us"]
    counts, sums = dict.fromkeys(labels, 0), dict.fromkeys(labels, 0.0)
    for size, *_ in gaps:
        label = next((f"<{b}us" for b in GAP_BUCKETS_US if size < b), labels[-1])
        counts[label] += 1
        sums[label] += size / 1e3
    largest = []
    for size, before, after, idle_from, idle_to in sorted(gaps, reverse=True)[:top]:
        running = sorted({name for s, e, name in host if s <= idle_to <= e and e - s < 1e5})[:6]
        largest.append({"us": size, "after": before[:70], "before": after[:70],
                        "at_ms": (idle_from - call_start) / 1e3, "host_running": running})
    return {
        "kernels": len(kernels), "span_ms": (call_end - call_start) / 1e3,
        "lead_ms": (kernels[0][0] - call_start) / 1e3, "busy_ms": busy / 1e3,
        "gap_ms": sum(g[0] for g in gaps) / 1e3, "tail_ms": (call_end - run_end) / 1e3,
        "gap_counts": counts, "gap_ms_by_size": sums, "largest_gaps": largest,
    }


def profile_timeline(fn: Callable[[], object], trace_path: str | None = None, top: int = 12) -> dict:
    """One fn() call (after one warm-up) on the timeline; `trace_path` also gets a gzipped Chrome trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = list(prof.events())
    if trace_path:
        plain = trace_path.removesuffix(".gz")
        prof.export_chrome_trace(plain)
        with open(plain, "rb") as src, gzip.open(plain + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(plain)
    return summarize(_spans(events, kernels=True), _spans(events, kernels=False), top)


def format_timeline(label: str, t: dict) -> str:
    if not t.get("kernels"):
        return f"{label}: no kernels seen"
    lines = [f"{label}: span {t['span_ms']:.2f} ms = lead {t['lead_ms']:.2f} + busy {t['busy_ms']:.2f} "
             f"+ gaps {t['gap_ms']:.2f} + tail {t['tail_ms']:.2f} ({t['kernels']} kernels)",
             "  gaps by size: " + ", ".join(f"{k} {n} ({t['gap_ms_by_size'][k]:.2f} ms)"
                                            for k, n in t["gap_counts"].items())]
    for g in t["largest_gaps"]:
        lines.append(f"  {g['us']:8.1f} us at {g['at_ms']:6.2f} ms  {g['after'][:40]} -> {g['before'][:40]}"
                     f"  host: {', '.join(n[:40] for n in g['host_running'])}")
    return "\n".join(lines)
