"""The DFlash drafter in plain torch, laid out exactly as vLLM's `DFlashDraftModel` loads it.

What vLLM 0.32 (`qwen3_dflash.py`) computes, and so what we train:

* context c_j = hidden_norm(fc(concat_l h^(l)_j)) for the target's hidden
  states h^(l) at `target_layer_ids` (HF indexing: layer id L is HF
  `hidden_states[L + 1]`, the output of decoder layer L; vLLM adds 1).
* in every draft layer, context keys/values are k_norm(k_proj(c)) with RoPE at
  the context positions and v_proj(c): no input_layernorm on the context.
* block tokens (anchor + mask tokens) are embedded with the target's frozen
  embeddings and run through Qwen3 pre-norm layers (q/k per-head RMSNorm,
  neox RoPE at their absolute positions, GQA, SiLU MLP); queries attend to the
  masked set of context + block keys; final norm, then the target's frozen
  LM head.

RoPE is the one the drafter config declares (shape.Rope): plain, or YaRN as
vLLM's get_rope builds it for `rope_type: yarn` (the Kimi K2.6 drafter:
factor 64 over 4096 positions). YaRN changes every position, short ones
included (slow dims are interpolated, cos/sin scaled by 0.1 ln(factor) + 1),
so a drafter trained with plain RoPE is served other attention than it learned.

Parameter names are vLLM's checkpoint names (fc.weight, hidden_norm.weight,
layers.N.self_attn.q_proj.weight, ..., norm.weight); the frozen embedding
and LM head are buffers, never exported.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.drafter import DrafterShape, Rope

# With a tied-embedding target (SmolLM2) a fresh drafter's residual stream is
# mostly its input embedding, so a unit final norm makes every slot predict
# its own input token with a logit of ~|h||e| (measured: first-step loss 68
# instead of ~11) and the first ~50 steps only unlearn that. A small initial
# gain starts training near the uniform-prediction loss.
FINAL_NORM_INIT = 0.1


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x).to(dt)


def yarn_correction_range(rope: Rope, dim: int) -> tuple[float, float]:
    """The rotary dims between which YaRN blends interpolation into extrapolation: the dims that turn
    `beta_fast` and `beta_slow` times over the original context (vLLM's yarn_find_correction_range)."""
    orig, base = rope.get("original_max_position_embeddings"), rope.theta

    def at(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = at(rope.get("beta_fast", 32)), at(rope.get("beta_slow", 1))
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def rope_inv_freq(head_dim: int, rope: Rope, device: torch.device | None = None) -> torch.Tensor:
    """[head_dim/2] angular speeds. YaRN: dims that turn fast keep theta's speed (extrapolation), slow
    ones are divided by `factor` (interpolation), with a linear ramp between (computed as vLLM does,
    so the float32 values agree to the last bit or nearly)."""
    pos_freqs = rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    if rope.rope_type != "yarn":
        return 1.0 / pos_freqs
    low, high = yarn_correction_range(rope, head_dim)
    if low == high:
        high += 0.001  # as vLLM: no zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (theta's own speed), 0: interpolate
    return (1.0 / (rope.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


def rope_cos_sin(pos: torch.Tensor, head_dim: int, rope: Rope | float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., head_dim] at `pos`, scaled by YaRN's magnitude (1 for plain RoPE).
    A bare float is a plain rope of that theta."""
    rope = rope if isinstance(rope, Rope) else Rope("default", float(rope))
    f = pos.float()[..., None] * rope_inv_freq(head_dim, rope, pos.device)  # [..., hd/2]
    emb = torch.cat([f, f], dim=-1)
    m = rope.magnitude
    return (emb.cos() * m, emb.sin() * m) if m != 1.0 else (emb.cos(), emb.sin())


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """neox style (rotate half), as vLLM's default `is_neox_style=True`. x: [..., n, L, hd]; cos: [..., L, hd]."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return (x.float() * cos[..., None, :, :] + rot.float() * sin[..., None, :, :]).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, shape: DrafterShape):
        super().__init__()
        H, self.nh, self.nkv = shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads
        self.hd = shape.head_dim
        bias = shape.attention_bias
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=bias)
        eps = shape.rms_norm_eps
        self.q_norm = RMSNorm(self.hd, eps)
        self.k_norm = RMSNorm(self.hd, eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # [N, L, n*hd] -> [N, n, L, hd]
        return x.view(*x.shape[:-1], n, self.hd).transpose(-3, -2)

    def forward(
        self, x: torch.Tensor, ctx: torch.Tensor, rope_q: tuple, rope_c: tuple, mask: torch.Tensor
    ) -> torch.Tensor:
        """x: [N, Q, H] block inputs (normed); ctx: [N, T, H] context features; mask: [N, Q, T+Q] bool."""
        q = self.q_norm(self._heads(self.q_proj(x), self.nh))
        kb = self.k_norm(self._heads(self.k_proj(x), self.nkv))
        vb = self._heads(self.v_proj(x), self.nkv)
        kc = self.k_norm(self._heads(self.k_proj(ctx), self.nkv))
        vc = self._heads(self.v_proj(ctx), self.nkv)
        q = apply_rope(q, *rope_q)
        kb = apply_rope(kb, *rope_q)
        kc = apply_rope(kc, *rope_c)
        k = torch.cat([kc, kb], dim=-2)
        v = torch.cat([vc, vb], dim=-2)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
        out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask[:, None])
        out = out.transpose(-3, -2).reshape(*x.shape[:-1], self.nh * self.hd)
        return self.o_proj(out)


class MLP(nn.Module):
    """SiLU-gated, no bias (DFlash's Qwen3 layers and EAGLE-3's dense MLP alike)."""

    def __init__(self, H: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, shape: DrafterShape):
        super().__init__()
        eps = shape.rms_norm_eps
        self.self_attn = Attention(shape)
        self.mlp = MLP(shape.hidden_size, shape.intermediate_size)
        self.input_layernorm = RMSNorm(shape.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, eps)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        rope_q: tuple[torch.Tensor, torch.Tensor],
        rope_c: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_c, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, shape: DrafterShape | dict, embed: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        shape = DrafterShape.coerce(shape)
        H = shape.hidden_size
        n = len(shape.target_layer_ids)
        self.shape = shape
        self.fc = nn.Linear(n * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, shape.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(shape) for _ in range(shape.num_hidden_layers))
        self.norm = RMSNorm(H, shape.rms_norm_eps)
        # Shared with the target and frozen: buffers, so they are neither trained nor exported.
        self.register_buffer("embed_tokens", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)
        # A draft vocabulary (draft_vocab.py): the target ids the served drafter's own head scores.
        self.register_buffer("draft_ids", None, persistent=False)
        self.theta = shape.rope_theta
        self.rope = shape.rope
        self.head_dim = shape.head_dim

    def init_weights(self, std: float, gen: torch.Generator) -> None:
        """Normal(0, std) matrices, unit norms, except the final norm (see FINAL_NORM_INIT)."""
        for name, p in self.named_parameters():
            if name == "norm.weight":
                nn.init.constant_(p, FINAL_NORM_INIT)
            elif name.endswith("norm.weight"):
                nn.init.ones_(p)
            else:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def context(self, feats: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(feats))

    def hidden(
        self, feats: torch.Tensor, block_ids: torch.Tensor, block_pos: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """feats [N, T, n*H]; block_ids/pos [N, Q]; mask [N, Q, T+Q] -> final-normed hidden [N, Q, H]."""
        ctx = self.context(feats.to(self.fc.weight.dtype))  # captured in bf16; autocast decides compute
        T = feats.shape[1]
        rope_c = rope_cos_sin(torch.arange(T, device=feats.device).expand(feats.shape[0], T), self.head_dim, self.rope)
        rope_q = rope_cos_sin(block_pos, self.head_dim, self.rope)
        x = F.embedding(block_ids, self.embed_tokens).to(ctx.dtype)
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_c, mask)
        return self.norm(x)

    def logits(self, h: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the whole vocabulary, or over `ids` only (training's vocabulary subset, vocab.py).

        Rows flattened first: a strided 3-D `h @ W.t()` falls off the GEMM fast path (6x slower)."""
        head = self.lm_head if ids is None else self.lm_head[ids]
        return F.linear(h.reshape(-1, h.shape[-1]), head.to(h.dtype)).view(*h.shape[:-1], -1)

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """Greedy draft tokens (target ids), over the draft vocabulary when the drafter has one, as vLLM drafts."""
        if self.draft_ids is None:
            return self.logits(h).argmax(-1)
        return self.draft_ids[self.logits(h, self.draft_ids).argmax(-1)]
