"""Achieved bandwidth of the Triton attention kernels at Qwen3-14B per-layer shapes (40 query heads,
8 KV heads, head_dim 128, block_size 16, bf16, pages scattered at random), against the H200's
4.3 TB/s.

    python -m benchmarks.kernels --out kernels.json [--sweep]
    python -m benchmarks.kernels --fp8 --out kernels_fp8.json      # and the FP8 GEMMs
    python -m benchmarks.kernels --fp8-only --out kernels_fp8.json
    python -m benchmarks.kernels --fp8-only --fp8-batches 1,8,64    # the decode sizes alone, quicker
    python -m benchmarks.kernels --fp8-kv                           # and decode over fp8 KV pages

Bytes are what the kernel must move at least: K/V of every context token read once, Q read and O
written (the KV write: K/V rows read and written). Two times per row, both medians:
`do_bench` (triton.testing.do_bench: L2 flushed before each call, host launch overhead included
where it exceeds the GPU time) and `graph` (do_bench_cudagraph: the calls replayed from a CUDA
graph, no launch overhead, L2 not flushed, so contexts under 50 MB stay in L2). Each case is first
checked against ReferenceAttention in float32 (column `err`: worst |error| / max |reference|), and
the reference backend's own time is shown for scale. --sweep also times every split count and a
grid of tile shapes for decode and extend, for tuning the defaults in core/execution/attention/.
--fp8 adds every Qwen3-14B linear shape at decode and prefill batch sizes, bf16 against each FP8
GEMM path (benchmarks/lib/fp8_gemm_cases.py); --fp8-only times those alone; with --sweep, also
the Triton FP8 GEMM's tiles and split counts per shape (for fp8_kernels.matmul_tiles).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

from benchmarks.lib.ceilings import read_ceiling
from benchmarks.lib.fp8_gemm_cases import BATCHES, all_gemm_rows, print_gemm_table, sweep_gemm_tiles
from core.execution.attention.backend import AttentionMetadata, write_kv
from core.execution.attention.reference import ReferenceAttention
from core.execution.attention.triton_backend import TritonAttention
from core.execution.attention.triton_decode import DecodeSplits, DecodeTiles, decode_attention, decode_tiles
from core.execution.attention.triton_extend import ExtendTiles, extend_attention, extend_work_list
from core.execution.attention.triton_kv_write import write_kv_paged
from core.execution.kv_cache import FP8_KV_DTYPE, to_cache_dtype

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 40, 8, 128, 16
SCALE = HEAD_DIM**-0.5
DTYPE = torch.bfloat16
CONTEXT = 2048
DEVICE = "cuda"
# (cached_len, chunk_len) per request: a whole prompt, a batch of chunks, chunks after a cached
# prefix, and the shared-prefix workload's step (64 questions after a 2,048-token cached prefix).
EXTEND_CASES = [("1 x 2048 prefill", [(0, 2048)]), ("4 x 512 prefill", [(0, 512)] * 4),
                ("4 x 512 after 1536 cached", [(1536, 512)] * 4),
                ("64 x 128 after 2048 cached", [(2048, 128)] * 64)]


@dataclass
class Step:
    q: torch.Tensor  # [T, q_heads, head_dim]
    k: torch.Tensor  # [T, kv_heads, head_dim]
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_pages, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    meta: AttentionMetadata


@dataclass
class Row:
    kernel: str
    case: str
    mbytes: float  # bytes moved at least, MB
    do_bench_us: float
    graph_us: float | None
    tflops: float | None = None  # attention matmul FLOPs (causal) per second, extend only
    error: float | None = None
    reference_us: float | None = None
    extra: dict = field(default_factory=dict)

    def tb_s(self, micros: float | None) -> float | None:
        return None if micros is None else self.mbytes * 1e6 / (micros * 1e-6) / 1e12


def build_step(requests: list[tuple[int, int]], seed: int = 0) -> Step:
    """requests: (cached_len, chunk_len) each; every request's pages scattered at random in the pool."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    seq_lens = np.array([cached + chunk for cached, chunk in requests], np.int32)
    num_pages_of = [-(-int(n) // BLOCK_SIZE) for n in seq_lens]
    num_pages = sum(num_pages_of)
    order = np.random.default_rng(seed).permutation(num_pages).astype(np.int32)
    block_table = np.zeros((len(requests), max(num_pages_of)), np.int32)
    slots, used = [], 0
    for i, (cached, chunk) in enumerate(requests):
        pages = order[used : used + num_pages_of[i]]
        used += num_pages_of[i]
        block_table[i, : len(pages)] = pages
        positions = np.arange(cached, cached + chunk)
        slots.append(pages[positions // BLOCK_SIZE].astype(np.int64) * BLOCK_SIZE + positions % BLOCK_SIZE)
    num_tokens = sum(chunk for _, chunk in requests)
    cache_shape = (num_pages, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = (torch.randn(cache_shape, generator=generator, device=DEVICE).to(DTYPE) for _ in "kv")
    q = torch.randn(num_tokens, Q_HEADS, HEAD_DIM, generator=generator, device=DEVICE).to(DTYPE)
    k, v = (torch.randn(num_tokens, KV_HEADS, HEAD_DIM, generator=generator, device=DEVICE).to(DTYPE)
            for _ in "kv")
    query_start = np.concatenate([[0], np.cumsum([chunk for _, chunk in requests])]).astype(np.int32)
    query_lens = np.diff(query_start)
    meta = AttentionMetadata(
        query_start=torch.from_numpy(query_start).to(DEVICE), seq_lens=torch.from_numpy(seq_lens).to(DEVICE),
        block_table=torch.from_numpy(block_table).to(DEVICE),
        kv_index=torch.from_numpy(np.concatenate(slots)).to(DEVICE),
        query_start_cpu=query_start, seq_lens_cpu=seq_lens,
        max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()),
    )
    return Step(q, k, v, k_cache, v_cache, meta)


def attention_bytes(step: Step) -> int:
    itemsize = step.q.element_size()
    kv = int(step.meta.seq_lens_cpu.sum()) * KV_HEADS * HEAD_DIM * step.k_cache.element_size() * 2
    return kv + 2 * step.q.numel() * itemsize  # + Q read + O written


def with_fp8_pages(step: Step) -> Step:
    """The step over an fp8 KV cache (--kv-cache-dtype fp8) holding its pages' values rounded."""
    return Step(step.q, step.k, step.v, to_cache_dtype(step.k_cache, FP8_KV_DTYPE),
                to_cache_dtype(step.v_cache, FP8_KV_DTYPE), step.meta)


def causal_flops(step: Step) -> int:
    query_start, seq_lens = step.meta.query_start_cpu, step.meta.seq_lens_cpu
    visible = 0
    for i, seq_len in enumerate(seq_lens.tolist()):
        chunk = int(query_start[i + 1] - query_start[i])
        # Query j of the chunk sees seq_len - chunk + j + 1 keys.
        visible += chunk * (seq_len - chunk) + chunk * (chunk + 1) // 2
    return 4 * visible * Q_HEADS * HEAD_DIM  # QK^T and PV, 2 FLOPs per multiply-add


def median_us(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def graph_us(fn) -> float | None:
    try:
        return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
    except Exception as exc:  # a capture failure must not hide the other figures
        print(f"  (CUDA graph timing failed: {type(exc).__name__}: {exc})")
        return None


def relative_error(step: Step, out: torch.Tensor) -> float:
    with sdpa_kernel(SDPBackend.MATH):
        expected = ReferenceAttention().forward(step.q.float(), step.k.float(), step.v.float(),
                                                step.k_cache.float(), step.v_cache.float(), step.meta, SCALE)
    return float((out.float() - expected).abs().max() / expected.abs().max())


def attention_row(kernel: str, case: str, step: Step, backend: TritonAttention) -> Row:
    # The step's K/V go into the pages once; the timed calls only attend (a step of fresh prompts
    # reading its own K/V rows, as the server's forward does).
    write_kv_paged(step.k, step.v, step.k_cache, step.v_cache, step.meta.kv_index)
    step_kv = (step.k, step.v)
    attend = lambda: backend.attend(step.q, step.k_cache, step.v_cache, step.meta, SCALE, step_kv)  # noqa: E731
    error = relative_error(step, attend())
    reference = ReferenceAttention()
    reference_us = median_us(lambda: reference.forward(step.q, step.k, step.v, step.k_cache, step.v_cache,
                                                       step.meta, SCALE))
    flops = causal_flops(step) if kernel == "extend" else None
    row = Row(kernel, case, attention_bytes(step) / 1e6, median_us(attend), graph_us(attend), error=error,
              reference_us=reference_us)
    if flops is not None:
        row.tflops = flops / (row.do_bench_us * 1e-6) / 1e12
    plan = backend._launch_for(step.q, step.k_cache, step.v_cache, step.meta)
    row.extra = {"splits": plan.splits._asdict() if plan.splits else None,
                 "extend_tiles": plan.tiles._asdict() if plan.tiles else None}
    return row


def kv_write_rows(num_tokens: int) -> list[Row]:
    step = build_step([(0, num_tokens)])
    mbytes = 2 * 2 * step.k.numel() * step.k.element_size() / 1e6  # K and V, read and written
    slots = step.meta.kv_index
    ours = lambda: write_kv_paged(step.k, step.v, step.k_cache, step.v_cache, slots)  # noqa: E731
    torch_copy = lambda: write_kv(step.k, step.v, step.k_cache, step.v_cache, slots)  # noqa: E731
    case = f"{num_tokens} tokens"
    return [Row("kv_write triton", case, mbytes, median_us(ours), graph_us(ours)),
            Row("kv_write index_copy_", case, mbytes, median_us(torch_copy), graph_us(torch_copy))]


def sweep_decode(batch: int) -> list[dict]:
    step = build_step([(CONTEXT - 1, 1)] * batch, seed=batch)
    write_kv_paged(step.k, step.v, step.k_cache, step.v_cache, step.meta.kv_index)
    out, meta = torch.empty_like(step.q), step.meta
    mbytes = attention_bytes(step) / 1e6
    results = []
    default = decode_tiles(DTYPE)
    tile_grid = [default] + [DecodeTiles(n, w, s) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3)
                             if (n, w, s) != tuple(default)]
    split_grid = [s for s in (1, 2, 4, 8, 16, 32, 64) if CONTEXT // s >= 32]
    for tiles in tile_grid:
        for num_splits in split_grid if tiles == default else [None]:
            if num_splits is None:  # other tiles: at the split count the backend would pick
                planned = TritonAttention(DEVICE)._launch_for(step.q, step.k_cache, step.v_cache, step.meta)
                num_splits = planned.splits.num_splits
            split_tokens = triton.cdiv(triton.cdiv(CONTEXT, num_splits), tiles.block_n) * tiles.block_n
            splits = DecodeSplits(triton.cdiv(CONTEXT, split_tokens), split_tokens)
            shape = (batch, Q_HEADS, splits.num_splits)
            partial_out = torch.empty(*shape, HEAD_DIM, device=DEVICE) if splits.num_splits > 1 else None
            partial_lse = torch.empty(*shape, device=DEVICE) if splits.num_splits > 1 else None

            def run(splits=splits, partial_out=partial_out, partial_lse=partial_lse, tiles=tiles):
                decode_attention(step.q, step.k_cache, step.v_cache, out, meta.block_table, meta.seq_lens,
                                 meta.query_start, SCALE, splits, partial_out, partial_lse, tiles)

            try:
                micros = median_us(run)
            except Exception as exc:  # e.g. a tile that needs more shared memory than an SM has
                print(f"  decode batch {batch} {tiles} {splits}: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            results.append({"kernel": "decode", "batch": batch, **tiles._asdict(), **splits._asdict(),
                            "us": micros, "tb_s": mbytes * 1e6 / (micros * 1e-6) / 1e12})
    return results


def sweep_extend(case: str, requests: list[tuple[int, int]]) -> list[dict]:
    step = build_step(requests)
    write_kv_paged(step.k, step.v, step.k_cache, step.v_cache, step.meta.kv_index)
    out, meta = torch.empty_like(step.q), step.meta
    flops = causal_flops(step)
    results = []
    for block_m in (64, 128):
        work = torch.from_numpy(extend_work_list(step.meta.query_start_cpu, step.meta.seq_lens_cpu,
                                                 block_m)).to(DEVICE)
        for block_n in (32, 64, 128):
            for num_warps in (4, 8):
                for num_stages in (1, 2, 3):
                    tiles = ExtendTiles(block_m, block_n, num_warps, num_stages)

                    def run(tiles=tiles, work=work):
                        extend_attention(step.q, step.k_cache, step.v_cache, out, meta.block_table,
                                         meta.seq_lens, meta.query_start, SCALE, work, tiles)

                    try:
                        micros = median_us(run)
                    except Exception as exc:
                        print(f"  extend {case} {tiles}: {type(exc).__name__}: {str(exc)[:80]}")
                        continue
                    results.append({"kernel": "extend", "case": case, **tiles._asdict(), "us": micros,
                                    "tflops": flops / (micros * 1e-6) / 1e12})
    return results


def fmt(value: float | None, spec: str) -> str:
    width = int(spec.split(".")[0])
    return "-".rjust(width) if value is None else format(value, spec)


def print_table(rows: list[Row], ceiling_tb_s: float) -> None:
    """Each row's read rate also as a percentage of the device's measured read rate (`ceiling_tb_s`)."""
    pct = f"%{ceiling_tb_s:g}"
    header = (f"{'kernel':22s} {'case':26s} {'MB':>8s} {'do_bench us':>11s} {'TB/s':>6s} {pct:>5s} "
              f"{'graph us':>9s} {'TB/s':>6s} {pct:>5s} {'TFLOP/s':>8s} {'ref us':>9s} {'err':>8s}")
    print(header)
    print("-" * len(header))
    for r in rows:
        bw, graph_bw = r.tb_s(r.do_bench_us), r.tb_s(r.graph_us)
        print(f"{r.kernel:22s} {r.case:26s} {r.mbytes:8.1f} {r.do_bench_us:11.1f} {bw:6.2f} "
              f"{100 * bw / ceiling_tb_s:5.1f} {fmt(r.graph_us, '9.1f')} {fmt(graph_bw, '6.2f')} "
              f"{fmt(graph_bw and 100 * graph_bw / ceiling_tb_s, '5.1f')} {fmt(r.tflops, '8.1f')} "
              f"{fmt(r.reference_us, '9.1f')} {fmt(r.error, '8.1e')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write every figure as JSON here")
    parser.add_argument("--sweep", action="store_true", help="also time split counts and tile shapes")
    parser.add_argument("--fp8", action="store_true", help="also time the FP8 GEMMs against bf16")
    parser.add_argument("--fp8-only", action="store_true", help="time the FP8 GEMMs against bf16 only")
    parser.add_argument("--fp8-kv", action="store_true",
                        help="also time decode attention over fp8 KV pages (--kv-cache-dtype fp8)")
    parser.add_argument("--fp8-batches", default=",".join(map(str, BATCHES)),
                        help="the token counts M the FP8 GEMMs are timed at (default: %(default)s)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.kernels needs a CUDA GPU")
    torch.manual_seed(0)
    backend = TritonAttention(DEVICE)

    rows = []
    if not args.fp8_only:
        rows += kv_write_rows(256) + kv_write_rows(2048)
        for batch in (1, 16, 64, 256):
            step = build_step([(CONTEXT - 1, 1)] * batch, seed=batch)
            rows.append(attention_row("decode", f"batch {batch} x {CONTEXT} ctx", step, backend))
            if args.fp8_kv:
                rows.append(attention_row("decode, fp8 KV", f"batch {batch} x {CONTEXT} ctx",
                                          with_fp8_pages(step), backend))
            del step
        for case, requests in EXTEND_CASES:
            rows.append(attention_row("extend", case, build_step(requests), backend))
    batches = tuple(int(m) for m in args.fp8_batches.split(","))
    gemm_rows = all_gemm_rows(batches) if args.fp8 or args.fp8_only else []

    sweep = []
    if args.sweep and gemm_rows:
        sweep += [{"kernel": "fp8 gemm", **entry} for entry in sweep_gemm_tiles()]
    if args.sweep and not args.fp8_only:
        for batch in (1, 16, 64, 256):
            sweep += sweep_decode(batch)
        for case, requests in EXTEND_CASES:
            sweep += sweep_extend(case, requests)

    device = torch.cuda.get_device_name()
    ceiling_tb_s, ceiling_of = read_ceiling(device)
    print(f"\n{device}, Qwen3-14B per-layer shapes ({Q_HEADS} q heads, {KV_HEADS} KV heads, head_dim "
          f"{HEAD_DIM}, block_size {BLOCK_SIZE}, {str(DTYPE).removeprefix('torch.')}), ceiling "
          f"{ceiling_tb_s} TB/s ({ceiling_of})\n")
    if rows:
        print_table(rows, ceiling_tb_s)
    if gemm_rows:
        print(f"\nQwen3-14B linear layers, bf16 and FP8 (ceilings {ceiling_tb_s} TB/s; tensor cores "
              "989 TFLOP/s bf16, 1,979 FP8):\n")
        print_gemm_table(gemm_rows, ceiling_tb_s)
    for r in rows:
        if r.extra.get("splits") or r.extra.get("extend_tiles"):
            print(f"  {r.kernel} {r.case}: {r.extra}")
    if sweep:
        print("\nsweep (median us; decode TB/s, extend TFLOP/s), best per case first:")
        keyed: dict[str, list[dict]] = {}
        for s in sweep:
            if s["kernel"] == "fp8 gemm":
                key = f"fp8 gemm {s['layer']} M={s['m']}"
            else:
                key = f"decode batch {s['batch']}" if s["kernel"] == "decode" else s["case"]
            keyed.setdefault(key, []).append(s)
        for key, entries in keyed.items():
            entries.sort(key=lambda s: s["us"])
            print(f"  {key}:")
            for s in entries[:6]:
                print("    " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in s.items()
                                         if k not in ("kernel", "batch", "case", "layer", "m")))
    if args.out:
        report = {"device": device, "ceiling_tb_s": ceiling_tb_s, "dtype": str(DTYPE),
                  "shapes": {"q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                             "block_size": BLOCK_SIZE, "context": CONTEXT},
                  "rows": [{**asdict(r), "do_bench_tb_s": r.tb_s(r.do_bench_us),
                            "graph_tb_s": r.tb_s(r.graph_us)} for r in rows],
                  "sweep": sweep,
                  "fp8_gemms": [{**asdict(r), "tb_s": r.tb_s(r.graph_us or r.do_bench_us),
                                 "tflops": r.tflops(r.graph_us or r.do_bench_us)} for r in gemm_rows]}
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
