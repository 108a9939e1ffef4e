"""Settle oneMKL's vector-math (VML) kernel dispatch on one thread, before an op can first call it on several.

On the CPU, torch computes float unary ops on contiguous tensors (cos, sin, exp, log, sqrt, ...; the
IMPLEMENT_VML_MKL list of ATen/cpu/vml.h) with MKL's VML: every intra-op thread calls it on its chunk,
asking for the high-accuracy kernels (VML_HA). oneMKL 2024.2, which the torch 2.13 CPU wheels link,
resolves VML's kernels lazily on the first call; when that first call runs on two threads at once, one of
them may compute its whole chunk with the enhanced-performance kernel (VML_EP, about 11 correct bits) in
spite of VML_HA (pytorch/pytorch#188792). The next call is right again, so it is one call, in a fresh
process, now and then. Here it was the RoPE cos table of the first model a process built
(layers.RotaryEmbedding: 1,024 x 64 values, two chunks of 512 rows): about one run in five, rows 1-511
were off by up to 1.5e-4, bit for bit what vmsCos gives in VML_EP mode, and the logits by ~1e-3: in
tests/test_fp8_linear.py the FP8 checkpoint's model, built first, then differed from its dequantized twin.

`resolve_vml_dispatch` calls each of those ops once on one element, in float32 and float64: so small an
op runs on the calling thread alone, and once it has, later calls on several threads get the kernels
asked for (fresh processes computing `torch.cos(torch.randn(512, 512))` twice on two threads: 17 of 80
gave VML_EP values in one chunk without it, 0 of 80 with it). The issue reports oneMKL >= 2025.0 free of
the race; pytorch/pytorch#188791 proposes the same warm-up inside torch.
"""

from __future__ import annotations

import functools

import torch

# ATen/cpu/vml.h routes these to MKL (IMPLEMENT_VML_MKL); the others have torch's own vectorized kernels.
VML_OPS = (torch.acos, torch.asin, torch.atan, torch.cos, torch.erf, torch.erfc, torch.erfinv, torch.exp,
           torch.log, torch.log10, torch.log2, torch.sin, torch.sqrt, torch.tan, torch.tanh, torch.trunc)


@functools.cache
def resolve_vml_dispatch() -> None:
    """Once per process, before the first sizable float op on the CPU (a model's RoPE tables)."""
    if not torch.backends.mkl.is_available():
        return
    for dtype in (torch.float32, torch.float64):
        one = torch.full((1,), 0.5, dtype=dtype, device="cpu")  # in every op's domain
        for op in VML_OPS:
            op(one)
