"""What a decode step would take without one kind of kernel: timing only, wrong numbers on purpose.

    python -m benchmarks.step_whatif no_quant --out no_quant.json -- --quantization fp8 --batches 1

Replaces one kind of the step's small kernels by nothing before `benchmarks.step_profile` builds
and captures its graphs, then runs it with the arguments after `--`. Under programmatic dependent
launch the kernels' own times overlap, so removing a kind from the graph is how to learn what it
costs the step's critical path (benchmarks/NOTES.md, "the one-row step without each kind of small
kernel"). The logits are wrong; compare only `graph_ms` against a run of `base`.

  base        nothing removed
  no_quant    one-row activation quantizations return a cached output (FP8 models)
  no_norm     RMSNorms (with and without the residual add) return their input
  no_qknorm   q/k norm + RoPE return q and k as they are
  no_attn     one-row attention skipped (KV write, split-K decode and its reduce): o_proj gets q
  no_kvwrite  the KV write skipped, attention kept
  one_split   decode attention in one split a request (no reduce kernel, far fewer programs)
  no_small    no_quant, no_norm, no_qknorm and no_attn at once
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable


def _replace(owner: object, name: str, value: object) -> None:
    """owner.name = value, for a name the code has: a renamed target fails here, not silently."""
    if not hasattr(owner, name):
        where = getattr(owner, "__name__", owner)
        raise AttributeError(f"{where} has no {name}: update benchmarks/step_whatif.py")
    setattr(owner, name, value)


def _remove_quantization() -> None:
    from core.execution.model import fp8_kernels  # fp8_gemm imports it from there at each call

    real, cached = fp8_kernels.quantize_activations, {}

    def quantize_activations(x, column_major_scales=False, rows=None, silu_mul=False, **options):
        if x.shape[0] > 1:
            return real(x, column_major_scales=column_major_scales, rows=rows, silu_mul=silu_mul, **options)
        width = x.shape[1] // (2 if silu_mul else 1)
        key = (width, x.device)
        if key not in cached:
            cached[key] = real(x[:, :width].contiguous())
        return cached[key]

    _replace(fp8_kernels, "quantize_activations", quantize_activations)


def _remove_norms() -> None:
    from core.execution.model import layers

    _replace(layers, "rms_norm", lambda x, weight, eps: x)
    _replace(layers, "add_rms_norm", lambda x, residual, weight, eps: (x, residual))


def _remove_qk_norm() -> None:
    from core.execution.model import qwen3

    _replace(qwen3, "qk_norm_rope", lambda q, k, *rest: (q, k))


def _remove_attention() -> None:
    from core.execution.model import qwen3

    real_forward = qwen3.Qwen3Attention.forward

    def forward(self, hidden, positions, rope, kv_cache, backend, meta):
        if hidden.shape[0] > 1:
            return real_forward(self, hidden, positions, rope, kv_cache, backend, meta)
        q, k, _ = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, _ = qwen3.qk_norm_rope(q.reshape(1, self.num_heads, self.head_dim),
                                  k.reshape(1, self.num_kv_heads, self.head_dim), self.q_norm.weight,
                                  self.k_norm.weight, rope.cos, rope.sin, positions, self.q_norm.eps)
        return self.o_proj(q.reshape(1, self.q_size))

    _replace(qwen3.Qwen3Attention, "forward", forward)


def _remove_kv_write() -> None:
    from core.execution.attention import triton_backend

    _replace(triton_backend, "write_kv_paged", lambda *args, **kwargs: None)


def _one_split() -> None:
    from core.execution.attention import triton_backend
    from core.execution.attention.triton_decode import DecodeSplits

    _replace(triton_backend, "plan_splits", lambda *args, **kwargs: DecodeSplits(1, 0))


PATCHES: dict[str, tuple[Callable[[], None], ...]] = {
    "base": (),
    "no_quant": (_remove_quantization,),
    "no_norm": (_remove_norms,),
    "no_qknorm": (_remove_qk_norm,),
    "no_attn": (_remove_attention,),
    "no_kvwrite": (_remove_kv_write,),
    "one_split": (_one_split,),
    "no_small": (_remove_quantization, _remove_norms, _remove_qk_norm, _remove_attention),
}


def apply(variant: str) -> None:
    """Patch the model code for `variant`; call before any model is built."""
    for patch in PATCHES[variant]:
        patch()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ours, profile_args = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=list(PATCHES))
    parser.add_argument("--out", required=True, help="step_profile's JSON")
    args = parser.parse_args(ours)
    apply(args.variant)
    from benchmarks import step_profile  # after the patches: it builds the model

    sys.argv = ["step_profile", *profile_args, "--out", args.out]
    step_profile.main()
    with open(args.out) as f:
        for row in json.load(f)["decode"]:
            print(f"{args.variant}: batch {row['batch']}: graph {row['graph_ms']:.3f} ms, "
                  f"{row['num_kernels']} kernels")


if __name__ == "__main__":
    main()
