"""Tensor-parallel building blocks of the Qwen3 model.

Each sharded layer records, for every checkpoint tensor it is built from, which slice of that tensor
this rank holds and where it goes in the layer's parameter (`CheckpointSlice`). The loader is then
one generic loop: look the name up, read the slice straight from the file, copy it in. The linear
layers know their checkpoint matrices' names from construction (so a checkpoint may leave some in
another format), split them over the ranks and leave the weight's parameters, the checkpoint
tensors behind them and the matmul to their LinearMethod (linear_method.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.execution.distributed import TPGroup
from core.execution.mkl_vml import resolve_vml_dispatch
from core.execution.model.checkpoint_slice import CheckpointSlice, SliceMap
from core.execution.model.fused import add_rms_norm, rms_norm
from core.execution.model.linear_method import LinearMethod
from core.execution.model.yarn import yarn_attention_factor, yarn_inv_freq
from core.rope_scaling import YarnScaling


class RMSNorm(nn.Module):
    """Normalises in float32, then scales in the input dtype, as the reference Qwen3 does. Given the
    residual stream too, adds x to it first (one fused kernel) and returns (normed, new residual)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)

    def checkpoint_slices(self, prefix: str) -> SliceMap:
        return {f"{prefix}.weight": ("weight", CheckpointSlice(tuple(self.weight.shape)))}


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's rows split over the TP ranks. Several checkpoint matrices may be packed
    into one (q, k and v; gate and up): `out_sizes` are their full row counts, `shard_names` the
    checkpoint names' suffixes after `prefix`, each split separately so every rank holds its share
    of each."""

    def __init__(self, in_features: int, out_sizes: list[int], shard_names: list[str], tp: TPGroup,
                 linear_method: LinearMethod, prefix: str) -> None:
        super().__init__()
        for size, name in zip(out_sizes, shard_names):
            if size % tp.size:
                raise ValueError(f"{name}: {size} output rows do not split over {tp.size} ranks")
        self.in_features = in_features
        self.local_sizes = [size // tp.size for size in out_sizes]
        self.out_sizes = out_sizes
        self.matrix_names = [f"{prefix}.{name}" for name in shard_names]
        self.tp = tp
        self.linear_method = linear_method.method_for(self.matrix_names)
        self.linear_method.create_weights(self, in_features, self.local_sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(self, x)

    def checkpoint_slices(self) -> SliceMap:
        matrices, offset = {}, 0
        for name, full, local in zip(self.matrix_names, self.out_sizes, self.local_sizes):
            matrices[name] = CheckpointSlice(
                (full, self.in_features), dim=0, start=self.tp.rank * local, length=local, dest_offset=offset
            )
            offset += local
        return self.linear_method.checkpoint_slices(matrices)


class RowParallelLinear(nn.Module):
    """y = x W^T with W's columns split over the TP ranks; the partial sums are all-reduced. `prefix`
    is the checkpoint matrix's name (`model.layers.0.mlp.down_proj`)."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, linear_method: LinearMethod,
                 prefix: str) -> None:
        super().__init__()
        if in_features % tp.size:
            raise ValueError(f"{in_features} input features do not split over {tp.size} ranks")
        self.in_features = in_features
        self.out_features = out_features
        self.local_in = in_features // tp.size
        self.matrix_name = prefix
        self.tp = tp
        self.linear_method = linear_method.method_for([prefix])
        self.linear_method.create_weights(self, self.local_in, [out_features])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.linear_method.apply(self, x))

    def forward_gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """forward(SiLU(gate) * up) of gate_up [T, 2 * in_features / tp] (gate first)."""
        return self.tp.all_reduce(self.linear_method.apply_gated(self, gate_up))

    def checkpoint_slices(self) -> SliceMap:
        return self.linear_method.checkpoint_slices({
            self.matrix_name: CheckpointSlice((self.out_features, self.in_features), dim=1,
                                              start=self.tp.rank * self.local_in, length=self.local_in)
        })


def finish_loading(model: nn.Module) -> None:
    """Once every checkpoint tensor is in: let each linear layer's method prepare what it multiplies."""
    for module in model.modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            module.linear_method.process_weights_after_loading(module)
        elif isinstance(module, ParallelLMHead):
            module.store_for_its_device()


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split over the TP ranks; a rank looks up the ids in its range and the
    all-reduce assembles the full vectors. The same weight layout serves as the LM head."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup) -> None:
        super().__init__()
        if vocab_size % tp.size:
            raise ValueError(f"vocab_size {vocab_size} does not split over {tp.size} ranks")
        self.vocab_size = vocab_size
        self.local_vocab = vocab_size // tp.size
        self.vocab_start = tp.rank * self.local_vocab
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(self.local_vocab, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local_ids = input_ids - self.vocab_start
        outside = (local_ids < 0) | (local_ids >= self.local_vocab)
        out = F.embedding(local_ids.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)

    def checkpoint_slices(self, prefix: str) -> SliceMap:
        hidden = self.weight.shape[1]
        return {
            f"{prefix}.weight": (
                "weight",
                CheckpointSlice((self.vocab_size, hidden), dim=0, start=self.vocab_start,
                                length=self.local_vocab),
            )
        }


class ParallelLMHead(VocabParallelEmbedding):
    """Vocabulary-parallel output projection; logits are gathered on TP rank 0 only."""

    def store_for_its_device(self) -> None:
        """A float32 weight on the CPU keeps its values hidden-major (a [hidden, vocab] tensor seen
        through its transpose). oneMKL multiplies one or two rows by it 2-3x faster than by the
        [vocab, hidden] rows a checkpoint stores (151,936 x 128 on one thread: 1 row 8.4 -> 3.6 ms, 2
        rows 16.9 -> 5.5, 8 rows 15.4 -> 13.1), and the logits are most of a small model's CPU step. A
        tied embedding shares the view; its row gathers stay cheap (300 ids: 0.16 ms). bf16 and fp16
        multiply 2-2.5x slower that way, and GPUs gain nothing: they keep the checkpoint's layout."""
        if self.weight.device.type == "cpu" and self.weight.dtype == torch.float32:
            self.weight.data = self.weight.data.t().contiguous().t()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        local = F.linear(hidden, self.weight)  # [N, vocab / tp]
        return self.tp.gather_to_first(local, dim=-1)


class RotaryEmbedding(nn.Module):
    """Qwen3's RoPE (rotate-half form): cos/sin precomputed in float32 for every position, applied
    together with the q/k norm by `core.execution.model.fused.qk_norm_rope`. With YaRN scaling the
    frequencies are YaRN's and both tables carry its attention factor (core/execution/model/yarn.py)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: YarnScaling | None = None) -> None:
        super().__init__()
        resolve_vml_dispatch()  # the tables are often a process's first sizable cos and sin (mkl_vml.py)
        if scaling is None:
            inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
            factor = 1.0
        else:
            inv_freq, factor = yarn_inv_freq(head_dim, theta, scaling), yarn_attention_factor(scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        # [max_positions, head_dim / 2] each; not parameters, not in the checkpoint.
        self.register_buffer("cos", freqs.cos() * factor, persistent=False)
        self.register_buffer("sin", freqs.sin() * factor, persistent=False)
