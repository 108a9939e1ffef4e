"""Prefill attention of fresh prompts: Cadence's extend kernel reading the pages, reading the step's
own K/V rows (what the server runs when no prompt of the step has a cached prefix), and torch's
cuDNN and flash SDPA kernels beside them; plus what cuDNN's first call at a new length costs.

    python -m benchmarks.prefill_attention --lengths 512,1784,4096

Qwen3-14B's attention shape (40 query heads, 8 KV heads, head_dim 128, bf16), causal. Each row: the
median microseconds (triton.testing.do_bench) and the attention products' TFLOP/s; the fresh path's
output is compared bit for bit with the paged one's, SDPA's by the largest difference.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.kernels import KV_HEADS, SCALE, build_step, causal_flops, median_us
from core.execution.attention.triton_backend import TritonAttention
from core.execution.attention.triton_kv_write import write_kv_paged

SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def first_call_ms(length: int) -> tuple[float, float]:
    """cuDNN SDPA's first call at a new sequence length and its second, wall-clock ms."""
    q = torch.randn(1, 40, length, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, KV_HEADS, length, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with sdpa_kernel([SDPA_BACKENDS["cudnn"]]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times[0], times[1]


def compare(length: int, batch: int) -> None:
    """One step of `batch` fresh prompts of `length` tokens: each path's median us and TFLOP/s."""
    step = build_step([(0, length)] * batch)
    write_kv_paged(step.k, step.v, step.k_cache, step.v_cache, step.meta.kv_index)
    backend, flops = TritonAttention("cuda"), causal_flops(step)

    def triton_attention(step_kv=None):
        return backend.attend(step.q, step.k_cache, step.v_cache, step.meta, SCALE, step_kv)

    paged, fresh = triton_attention(), triton_attention((step.k, step.v))
    print(f"{batch} x {length} tokens: the step's K/V give the pages' output bit for bit: "
          f"{torch.equal(paged, fresh)}")
    rows = {"triton, pages": median_us(triton_attention),
            "triton, step's K/V": median_us(lambda: triton_attention((step.k, step.v)))}
    if batch == 1:
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (step.q, step.k, step.v))
        for name, kind in SDPA_BACKENDS.items():
            def sdpa(kind=kind):
                with sdpa_kernel([kind]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE,
                                                          enable_gqa=True)
            try:
                difference = (sdpa()[0].transpose(0, 1) - paged).abs().max().item()
                rows[f"sdpa {name} (max diff {difference:.4f})"] = median_us(sdpa)
            except RuntimeError as exc:
                print(f"  sdpa {name}: {str(exc)[:100]}")
    for label, micros in rows.items():
        print(f"  {label:32s} {micros:8.1f} us  {flops / micros / 1e6:6.0f} TFLOP/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1784,4096", help="fresh prompt lengths (comma-separated)")
    parser.add_argument("--batch", type=int, default=1, help="prompts of each length in the step")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.prefill_attention needs a CUDA GPU")
    for length in (int(n) for n in args.lengths.split(",")):
        compare(length, args.batch)
    print("cuDNN's first call at a new length (it builds a graph per shape), then the second:")
    for length in (1784, 1785, 777, 3001):
        first, second = first_call_ms(length)
        print(f"  {length:5d} tokens: {first:7.2f} ms, then {second:.3f} ms")


if __name__ == "__main__":
    main()
