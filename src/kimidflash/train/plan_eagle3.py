"""`--plan` for train.method eagle3: an EAGLE-3 head on our engine, one whole replica per rank.

Why our engine and not speculators at Kimi scale: speculators 0.9.0 builds EAGLE-3 heads with
Llama and Qwen3 decoder layers only, so it has no MLA head to train; and sharding is not what a
one-layer head needs. K2.6's head (one MLA layer, a dense MLP, fc over three 7168-wide layers, an
LM head over the full 163,840 tokens) has 1.84B trainable parameters, 27.4 GiB in fp32 with
its gradients and AdamW moments, which one 192 GB MI300X holds beside its activations. So the run
is data-parallel (torchrun, DDP, eagle3_run.py): each rank trains a replica on its own batches.

The lines below are the memory of our implementation, not of EAGLE-3 in general: the training-
time test forward (eagle3_ttt.py) keeps every step's activations for backward, builds an explicit
boolean mask per step, and computes logits over the draft vocabulary for every counted row. Disk
is our capture shards (cache mode): per token the auxiliary layers at the target's width in
capture.dtype, an int32 token id and an int8 loss-mask byte. Time is FLOPs over a rank's bf16
peak at cluster.mfu; every rank does one step's batch at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..eagle3 import D2T, FC, LM_HEAD, Eagle3Error, Eagle3Head
from ..errors import TrainConfigError
from ..formats.drafter import read_json_file
from .config import TrainConfig

SHARD_TOKEN_BYTES = 5  # int32 token id + int8 loss mask per token in a capture shard
ACT_VALUES = 34  # bf16 values kept per hidden unit per row per step (as plan.py counts a DFlash layer)


@dataclass(frozen=True)
class HeadSize:
    """Parameter counts of a head, from the tensors a served head has (Eagle3Head.expected_tensors)."""

    layer: int  # the decoder layer: applied once per TTT step
    fc: int  # applied once per row
    lm_head: int  # draft_vocab_size x hidden
    norm: int
    embed: int  # the target's embedding, frozen and shared
    n_aux: int

    @property
    def trainable(self) -> int:
        return self.layer + self.fc + self.lm_head + self.norm


def head_of(cfg: TrainConfig) -> Eagle3Head:
    """The head drafter_config names (its auxiliary layers may be left to vLLM's default: 3)."""
    try:
        return Eagle3Head.from_config(read_json_file(Path(cfg.drafter_config or ""), "drafter_config"))
    except Eagle3Error as exc:
        raise TrainConfigError(f"{cfg.drafter_config}: {exc}") from None


def head_size(head: Eagle3Head) -> HeadSize:
    tensors = head.expected_tensors()
    n = {k: math.prod(v) for k, v in tensors.items() if k != D2T}
    fc, lm, norm = n.pop(FC), n.pop(LM_HEAD), n.pop("norm.weight")
    n_aux = tensors[FC][1] // head.target_hidden_size
    return HeadSize(sum(n.values()), fc, lm, norm, head.vocab_size * head.hidden_size, n_aux)


def _dims(head: Eagle3Head) -> tuple[int, int]:
    """(attention heads, query-key + value width per head) of the decoder layer."""
    c = head.raw
    nh = int(c["num_attention_heads"])
    if head.attention == "mla":
        return nh, int(c["qk_nope_head_dim"]) + int(c["qk_rope_head_dim"]) + int(c["v_head_dim"])
    return nh, 2 * int(c.get("head_dim") or head.hidden_size // nh)


def memory(head: Eagle3Head, cfg: TrainConfig, seq_len: int) -> list[tuple[str, float, str]]:
    """(what, bytes, why) per rank for a step of train.batch_size sequences padded to seq_len."""
    tc, s = cfg.train, cfg.train.ttt_steps
    size, (nh, _) = head_size(head), _dims(head)
    B, T, H = tc.batch_size, seq_len, head.hidden_size
    rows = B * T * s
    lines: list[tuple[str, float, str]] = [
        (
            "head, gradients, AdamW",
            16 * size.trainable,
            f"{size.trainable / 1e9:.2f}B trainable parameters x (4 weight + 4 gradient + 8 moments) bytes, fp32, "
            "a whole replica per rank",
        ),
        ("frozen embedding", 4 * size.embed, "the target's, fp32"),
        (
            "target features",
            4 * B * T * size.n_aux * head.target_hidden_size,
            f"{size.n_aux} auxiliary layers x {head.target_hidden_size}, fp32, {B} x {T} tokens",
        ),
        (
            "activations",
            2 * ACT_VALUES * rows * H,
            f"{rows} rows ({B} x {T} tokens x {s} TTT steps) x {ACT_VALUES} bf16 values per hidden unit, kept for "
            "backward",
        ),
        (
            "attention scores",
            2 * 2 * B * nh * T * T * s * (s + 1) // 2,
            f"bf16 scores and probabilities, {nh} heads, T x T(j+1) keys at step j: the explicit mask leaves SDPA "
            "its math kernel at worst",
        ),
        (
            "logits",
            3 * 4 * rows * head.draft_vocab_size,
            f"{rows} rows x {head.draft_vocab_size} draft tokens, fp32: logits, softmax and gradient (every row "
            "counted: an upper bound)",
        ),
    ]
    if tc.init_from_drafter and tc.anchor_l2:
        lines.insert(1, ("anchor weights", 4 * size.trainable, "fp32 copy of the start the L2 anchor pulls toward"))
    return lines


def flops_per_step(head: Eagle3Head, cfg: TrainConfig, seq_len: int) -> float:
    """One rank's step: forward and backward (x3) of fc once per row, the layer and the LM head at
    every TTT step, and block 0's T x T scores at every step (the masked kernel computes them all)."""
    tc, s = cfg.train, cfg.train.ttt_steps
    size, (nh, width) = head_size(head), _dims(head)
    B, T = tc.batch_size, seq_len
    return 6 * size.fc * B * T + 6 * (size.layer + size.lm_head) * B * T * s + 3 * 2 * B * nh * T * T * width * s


def disk_bytes_per_token(head: Eagle3Head, cfg: TrainConfig) -> int:
    elt = 4 if cfg.capture.dtype == "float32" else 2
    return head_size(head).n_aux * head.target_hidden_size * elt + SHARD_TOKEN_BYTES
