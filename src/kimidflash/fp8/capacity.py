"""KV-cache bytes per token for an MLA model, BF16 against FP8.

MLA caches one entry per token and layer: the compressed latent (kv_lora_rank values)
and the rope key (qk_rope_head_dim values), replicated on every tensor-parallel rank
(the latent is shared by all heads, so TP does not split it). docs/fp8-kv.md's table is
this module's output for Kimi K2.6 (tests/fp8/test_fp8_docs.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class MlaDims:
    kv_lora_rank: int
    qk_rope_head_dim: int
    num_hidden_layers: int

    @property
    def entry_values(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def bytes_per_token(self, bytes_per_value: int) -> int:
        """Cache bytes one token takes on one GPU, over all layers."""
        return self.entry_values * bytes_per_value * self.num_hidden_layers

    def tokens_per_gib(self, bytes_per_value: int) -> int:
        return GIB // self.bytes_per_token(bytes_per_value)


# Kimi K2.6's text model (DeepSeek-V3 attention): config.json's values.
KIMI_K26 = MlaDims(kv_lora_rank=512, qk_rope_head_dim=64, num_hidden_layers=61)
DTYPE_BYTES = {"BF16": 2, "FP8": 1}


def table(dims: MlaDims = KIMI_K26) -> list[dict[str, int | str]]:
    return [
        {
            "dtype": name,
            "bytes_per_entry": dims.entry_values * b,
            "bytes_per_token": dims.bytes_per_token(b),
            "tokens_per_gib": dims.tokens_per_gib(b),
        }
        for name, b in DTYPE_BYTES.items()
    ]
