"""The Qwen3 decoder's elementwise layers, each one Triton kernel on the GPU instead of many torch ones.

At decode batch sizes a layer's matmuls are short and the small elementwise kernels between them
add up: unfused, a float32 RMSNorm is about six torch kernels, q/k norm plus RoPE about sixteen,
SiLU * up three, plus the residual adds. Called by layers.py and qwen3.py beside it:

- `add_rms_norm`: the residual add and the next RMSNorm (`rms_norm`: the norm alone), one row a program.
- `qk_norm_rope`: Qwen3's per-head RMSNorm of q and k, then rotate-half RoPE; q and k in one launch,
  a group of up to eight heads of one token a program (one head a program left a prefill's 1,784 x 48
  programs moving 256 bytes each, at a fifth of the bandwidth).
- `silu_mul`: SiLU(gate) * up over the packed gate_up projection's output.

Each function runs its Triton kernel on CUDA tensors (when triton is installed) and otherwise the
unfused torch ops, which are the model's definition; `use_triton` forces either (the tests run the
kernels on the CPU through the Triton interpreter). The kernels round where the torch ops round:
float32 inside each op, the op's output cast to the input dtype. So they differ from torch only in
the order of the float32 sum of squares and in rsqrt's and exp's last float32 bits. They are built
with floating-point contraction off, since an FMA would skip a rounding torch's separate kernels do.
Launches depend on tensor shapes only, so CUDA graphs capture them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.execution.dependent_launch import dependent_launch, gdc_launch_dependents, gdc_wait, launch_options

try:
    import triton
    import triton.language as tl
except ImportError:  # an install without triton: the torch ops serve every device
    triton = None


def _triton_runs(x: torch.Tensor, use_triton: bool | None) -> bool:
    if use_triton is None:
        return triton is not None and x.is_cuda
    if use_triton and triton is None:
        raise RuntimeError("use_triton=True, but triton is not installed")
    return use_triton


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with the last dim contiguous (the kernels step rows by a stride)."""
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


# --- residual add + RMSNorm ----------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
             use_triton: bool | None = None) -> torch.Tensor:
    """RMSNorm over the last dim: normalised in float32, cast to x's dtype, then scaled by weight."""
    if not _triton_runs(x, use_triton):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)
    return _rms_norm_triton(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), the sum rounded to x's dtype."""
    if not _triton_runs(x, use_triton):
        new_residual = x + residual
        return rms_norm(new_residual, weight, eps, use_triton=False), new_residual
    return _rms_norm_triton(x, residual, weight, eps)


def _rms_norm_triton(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    size = x.shape[-1]
    rows = _rows(x)
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if residual is None:
        residual_rows = new_residual = rows  # unread and unwritten: HAS_RESIDUAL is off
    else:
        residual_rows = _rows(residual)
        new_residual = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    block = _next_power_of_2(size)
    pdl = dependent_launch(x.device)
    _rms_norm_kernel[(rows.shape[0],)](
        rows, residual_rows, weight, out, new_residual,
        rows.stride(0), residual_rows.stride(0), size, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, PDL=pdl, **launch_options(pdl),
        # 16 values a thread (two 16-byte loads in bf16): 16 warps for Qwen3-14B's 5,120.
        num_warps=max(1, min(16, block // 512)), enable_fp_fusion=False,
    )
    return out.view(x.shape), None if residual is None else new_residual.view(x.shape)


# --- per-head q/k RMSNorm + RoPE -----------------------------------------------------------------


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, eps: float, *,
                 use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, q_heads, head_dim] and k [T, kv_heads, head_dim] (any strides), each head RMSNormed
    then rotated (rotate-half RoPE) by the float32 cos/sin rows [max_positions, head_dim / 2] of
    `positions` [T]: new contiguous (q, k)."""
    if not _triton_runs(q, use_triton):
        q, k = rms_norm(q, q_weight, eps, use_triton=False), rms_norm(k, k_weight, eps, use_triton=False)
        cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # [T, 1, head_dim / 2]
        out = []
        for x in (q, k):
            x1, x2 = x.float().chunk(2, dim=-1)
            out.append(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype))
        return out[0], out[1]
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    q_out = torch.empty(q.shape, dtype=torch.promote_types(q_weight.dtype, q.dtype), device=q.device)
    k_out = torch.empty(k.shape, dtype=torch.promote_types(k_weight.dtype, k.dtype), device=k.device)
    half = head_dim // 2
    heads = _heads_per_program(num_q_heads, num_kv_heads)
    block_half = _next_power_of_2(half)
    pdl = dependent_launch(q.device)
    _qk_norm_rope_kernel[(num_tokens, (num_q_heads + num_kv_heads) // heads)](
        q, k, q_out, k_out, q_weight, k_weight, cos, sin, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), q_out.stride(0), k_out.stride(0),
        cos.stride(0), eps,
        NUM_Q_GROUPS=num_q_heads // heads, HEADS=heads, HALF=half, BLOCK_HALF=block_half, PDL=pdl,
        **launch_options(pdl),
        # 8 values a thread: eight 128-dim heads on 2 warps
        num_warps=max(1, min(4, heads * block_half // 256)), enable_fp_fusion=False,
    )
    return q_out, k_out


def _heads_per_program(num_q_heads: int, num_kv_heads: int) -> int:
    """The most heads (a power of two, at most 8) that divides both head counts: a program's group
    is all q heads or all k heads."""
    heads = 8
    while num_q_heads % heads or num_kv_heads % heads:
        heads //= 2
    return heads


# --- SiLU(gate) * up -----------------------------------------------------------------------------

SILU_BLOCK = 1024  # 8 values a thread on 4 warps: 16-byte loads in bf16


def silu_mul(gate_up: torch.Tensor, *, use_triton: bool | None = None) -> torch.Tensor:
    """gate_up [..., 2 * I] (gate first, up second) -> SiLU(gate) * up [..., I]."""
    size = gate_up.shape[-1] // 2
    if not _triton_runs(gate_up, use_triton):
        gate, up = gate_up.split(size, dim=-1)
        return F.silu(gate) * up
    rows = _rows(gate_up)
    out = torch.empty(rows.shape[0], size, dtype=gate_up.dtype, device=gate_up.device)
    pdl = dependent_launch(gate_up.device)
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(size, SILU_BLOCK))](
        rows, out, rows.stride(0), size, BLOCK=SILU_BLOCK, PDL=pdl, **launch_options(pdl), num_warps=4,
        enable_fp_fusion=False,
    )
    return out.view(*gate_up.shape[:-1], size)


# --- the kernels ---------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,
                         stride_x, stride_residual, size, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # core/execution/dependent_launch.py
            gdc_launch_dependents()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < size
        weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)  # no kernel writes it: before the wait
        if PDL:
            gdc_wait()
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(new_residual_ptr + row * size + cols, x, mask=mask)
        x = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, 0) / size + eps)
        normed = (x * rstd).to(x_ptr.dtype.element_ty)
        out = weight.to(tl.float32) * normed.to(tl.float32)
        tl.store(out_ptr + row * size + cols, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _norm_rope_heads(x_ptr, stride_head, out_ptr, weight_ptr, cos, sin, heads, dims, mask, eps,
                         HALF: tl.constexpr):
        """A group of heads ([HEADS, BLOCK_HALF] halves): each RMSNormed as `_rms_norm_kernel`
        normalises a row, then RoPE in float32 on the rounded values."""
        x_offsets = heads[:, None] * stride_head + dims[None, :]
        x1 = tl.load(x_ptr + x_offsets, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + HALF + x_offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
        dtype = x_ptr.dtype.element_ty
        out_dtype = out_ptr.dtype.element_ty
        w1 = tl.load(weight_ptr + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(weight_ptr + HALF + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
        y1 = (w1 * (x1 * rstd).to(dtype).to(tl.float32)).to(out_dtype).to(tl.float32)
        y2 = (w2 * (x2 * rstd).to(dtype).to(tl.float32)).to(out_dtype).to(tl.float32)
        out_offsets = heads[:, None] * (2 * HALF) + dims[None, :]
        tl.store(out_ptr + out_offsets, (y1 * cos - y2 * sin).to(out_dtype), mask=mask)
        tl.store(out_ptr + HALF + out_offsets, (y2 * cos + y1 * sin).to(out_dtype), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, q_weight_ptr, k_weight_ptr,
                             cos_ptr, sin_ptr, positions_ptr,
                             stride_q_tok, stride_q_head, stride_k_tok, stride_k_head,
                             stride_q_out_tok, stride_k_out_tok, stride_table, eps,
                             NUM_Q_GROUPS: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr,
                             BLOCK_HALF: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # core/execution/dependent_launch.py
            gdc_launch_dependents()
        tok = tl.program_id(0).to(tl.int64)
        group = tl.program_id(1)  # groups of q heads first, then of k heads
        dims = tl.arange(0, BLOCK_HALF)
        mask = (dims < HALF)[None, :]
        # The step's positions and the RoPE tables: no kernel of the forward writes them.
        position = tl.load(positions_ptr + tok).to(tl.int64)
        cos = tl.load(cos_ptr + position * stride_table + dims, mask=dims < HALF, other=0.0)[None, :]
        sin = tl.load(sin_ptr + position * stride_table + dims, mask=dims < HALF, other=0.0)[None, :]
        if PDL:
            gdc_wait()
        if group < NUM_Q_GROUPS:
            heads = group * HEADS + tl.arange(0, HEADS)
            _norm_rope_heads(q_ptr + tok * stride_q_tok, stride_q_head, q_out_ptr + tok * stride_q_out_tok,
                             q_weight_ptr, cos, sin, heads, dims, mask, eps, HALF)
        else:
            heads = (group - NUM_Q_GROUPS) * HEADS + tl.arange(0, HEADS)
            _norm_rope_heads(k_ptr + tok * stride_k_tok, stride_k_head, k_out_ptr + tok * stride_k_out_tok,
                             k_weight_ptr, cos, sin, heads, dims, mask, eps, HALF)

    @triton.jit
    def _silu_mul_kernel(gate_up_ptr, out_ptr, stride_gate_up, size, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # core/execution/dependent_launch.py
            gdc_launch_dependents()
            gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < size
        gate = tl.load(gate_up_ptr + row * stride_gate_up + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gate_up_ptr + row * stride_gate_up + size + cols, mask=mask, other=0.0)
        silu = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
        out = silu.to(tl.float32) * up.to(tl.float32)
        tl.store(out_ptr + row * size + cols, out.to(out_ptr.dtype.element_ty), mask=mask)
