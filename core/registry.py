"""Which class implements each name a configuration may choose: a checkpoint's model_type, an
attention backend, a checkpoint's quantization format.

The tables name each class by its import path ("module:Class") instead of importing it, so that the
scheduler's side (core/config.py validates the names, procs/args.py offers them as choices) reads
them without torch, and so that a backend whose kernels need a package installed only where it runs
(triton) is imported only there. The executor turns a name into its class with
`core.execution.registry.registered_class`. Adding a model, an attention backend or a linear
method is one new module plus one line here (docs/architecture.md, "Adding a model, an attention
backend, a linear method").
"""

from __future__ import annotations

# A checkpoint's config.json `model_type` -> its CausalLM (core/execution/model/causal_lm.py).
MODEL_TYPES: dict[str, str] = {
    "qwen3": "core.execution.model.qwen3:Qwen3ForCausalLM",
}

# --attention-backend -> its AttentionBackend (core/execution/attention/backend.py).
ATTENTION_BACKENDS: dict[str, str] = {
    "reference": "core.execution.attention.reference:ReferenceAttention",
    "triton": "core.execution.attention.triton_backend:TritonAttention",
}

# What --attention-backend auto serves with, per device type.
AUTO_ATTENTION_BACKENDS: dict[str, str] = {"cuda": "triton", "cpu": "reference"}


def attention_backend_choices() -> tuple[str, ...]:
    """What EngineConfig.attention_backend and --attention-backend accept."""
    return ("auto", *ATTENTION_BACKENDS)


# A checkpoint's `quantization_config.quant_method` (None: no quantization_config, the weights are
# stored in the model's dtype) -> its LinearMethod (core/execution/model/linear_method.py).
LINEAR_METHODS: dict[str | None, str] = {
    None: "core.execution.model.unquantized_linear:UnquantizedLinearMethod",
    "fp8": "core.execution.model.fp8_linear:Fp8LinearMethod",
}
