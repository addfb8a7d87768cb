"""Tiny seeded models for the FP8 KV tests: a Kimi-K2-architecture MLA model
(DeepseekV3 with the real attention dims vLLM's CPU MLA backend needs) and a Llama.

Built locally (no hub), deterministic from a seed, with the CPU reference's byte-level
tokenizer and chat template so the calibration code path (chat template, tokens)
is the real one."""

from __future__ import annotations

from pathlib import Path

# Kimi K2.6's MLA attention dims (vLLM CPU_MLA refuses smaller ones); everything else tiny.
MLA = dict(
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=2,
    kv_lora_rank=512,
    q_lora_rank=64,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    head_dim=64,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    vocab_size=512,
    max_position_embeddings=4096,
    num_nextn_predict_layers=0,
    rope_interleave=True,
)
LLAMA = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    vocab_size=512,
    max_position_embeddings=4096,
)


def build(kind: str, out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a tiny ``kind`` ('mla' or 'llama') checkpoint with tokenizer to ``out``."""
    import torch
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM

    from kimidflash.cpu_reference.tiny import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    if kind == "mla":
        cfg = DeepseekV3Config(
            **MLA, rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.1, torch_dtype=dtype, **ids
        )
        model = DeepseekV3ForCausalLM(cfg)
        with torch.no_grad():  # random init leaves the correction bias empty; vLLM loads it
            for layer in model.model.layers[MLA["first_k_dense_replace"] :]:
                layer.mlp.gate.e_score_correction_bias.zero_()
    elif kind == "llama":
        cfg = LlamaConfig(
            **LLAMA, rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.1, torch_dtype=dtype, **ids
        )
        model = LlamaForCausalLM(cfg)
    else:
        raise ValueError(kind)
    model = model.to(getattr(torch, dtype)).eval()
    model.save_pretrained(out, safe_serialization=True)
    return out
