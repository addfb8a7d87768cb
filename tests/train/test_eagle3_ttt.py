"""The EAGLE-3 head in torch and its training-time-test objective (train/eagle3_model.py,
train/eagle3_ttt.py): the batched TTT forward computes, for every row and step, what a server's
draft steps compute one at a time from the head's KV cache; the head's tensors are the ones
vLLM's loader reads; DeepSeek's rope is the interleaved YaRN vLLM builds; and a head trained on
a few sequences learns to draft them."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from kimidflash.eagle3 import Eagle3Head
from kimidflash.train.eagle3_model import DeepseekRope, Eagle3Drafter
from kimidflash.train.eagle3_ttt import (
    brute_force_step_mask,
    draft_chains,
    step_labels,
    step_mask,
    ttt_forward,
    ttt_loss,
)

from ..support.helpers import CONFIGS

KIMI_HEAD = json.loads((CONFIGS / "tiny-kimi-k2.6-eagle3-draft.json").read_text())


def small(attention: str, **over) -> Eagle3Head:
    """A head small enough for the fast tier: the tiny K2.6 head's MLA dims shrunk, or a Llama one."""
    if attention == "mla":
        cfg = {
            **copy.deepcopy(KIMI_HEAD),
            "hidden_size": 32,
            "target_hidden_size": 32,
            "num_attention_heads": 2,
            "q_lora_rank": 16,
            "kv_lora_rank": 24,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 8,
            "intermediate_size": 48,
            "vocab_size": 64,
            "draft_vocab_size": 40,
        }
    else:
        cfg = {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 48,
            "vocab_size": 64,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-5,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
        }
    return Eagle3Head.from_config({**cfg, **over})


def drafter(head: Eagle3Head, seed: int = 0) -> Eagle3Drafter:
    torch.manual_seed(seed)
    ids = torch.randperm(head.vocab_size)[: head.draft_vocab_size].sort().values  # the draft vocabulary's target ids
    m = Eagle3Drafter(head, torch.randn(head.vocab_size, head.hidden_size), 3, draft_ids=ids)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.2)
            else:
                p.uniform_(0.5, 1.5)
    return m.double()


def test_the_step_mask_is_its_definition():
    for T, step in ((1, 0), (5, 0), (5, 1), (4, 3)):
        assert step_mask(T, step).tolist() == brute_force_step_mask(T, step)


def serve_like(m: Eagle3Drafter, tokens: torch.Tensor, feats: torch.Tensor, p: int, k: int) -> list[torch.Tensor]:
    """A server's draft round after the target verified through position p, one step at a time: step 0
    over rows 0..p into the KV cache, then one row per step reading the cache and its own entries."""
    attn = m.midlayer.self_attn
    x, res = m.layer_input(tokens[:, 1 : p + 2], m.fc(feats[:, : p + 1]))
    q, K, V = attn.qkv(x, torch.arange(p + 1)[None])
    o = F.scaled_dot_product_attention(
        q, K, V, attn_mask=torch.ones(p + 1, p + 1, dtype=torch.bool).tril(), scale=attn.scale
    )
    final, g = m.finish(attn.out(o), res)
    outs, g = [final[:, p]], g[:, p : p + 1]
    for j in range(1, k):
        x, res = m.layer_input(tokens[:, p + 1 + j : p + 2 + j], g)
        q, k_, v_ = attn.qkv(x, torch.tensor([[p + j]]))
        K, V = torch.cat([K[:, :, : p + j], k_], 2), torch.cat([V[:, :, : p + j], v_], 2)
        o = F.scaled_dot_product_attention(q, K, V, scale=attn.scale)
        final, g = m.finish(attn.out(o), res)
        outs.append(final[:, 0])
    return outs


@pytest.mark.parametrize("attention", ["mla", "standard"])
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_ttt_forward_is_what_the_draft_steps_compute_one_at_a_time(attention, norm_before_residual):
    head = small(attention, norm_before_residual=norm_before_residual)
    m = drafter(head)
    T, k = 12, 3
    tokens = torch.randint(0, head.vocab_size, (1, T))
    feats = torch.randn(1, T, 3 * head.target_hidden_size, dtype=torch.float64)
    batched = ttt_forward(m, tokens, feats, k)
    for p in (0, 4, T - k - 2):
        for j, h in enumerate(serve_like(m, tokens, feats, p, k)):
            assert torch.allclose(batched[j][:, p], h, atol=1e-10), (attention, p, j)


def test_a_row_counts_where_a_server_drafts_and_the_token_is_in_the_draft_vocabulary():
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    t2d = torch.full((16,), -1)
    t2d[torch.tensor([7, 8, 10])] = torch.tensor([0, 1, 2])  # 9 is outside the draft vocabulary
    labels, ok = step_labels(tokens, mask, torch.tensor([6]), 2, t2d)
    # rows drafting from a response token x_{i+1}: i = 1..4. Step 0, row i predicts x_{i+2}: 8 at row 1,
    # 9 (outside the vocabulary) at row 2, 10 at row 3, nothing past the length at row 4.
    assert ok[0].tolist() == [[False, True, False, True, False, False, False]]
    assert labels[0][0, 1].item() == 1 and labels[0][0, 3].item() == 2
    # step 1, row i predicts x_{i+3}: 9 at row 1 (out), 10 at row 2
    assert ok[1].tolist() == [[False, False, True, False, False, False, False]]


def test_deepseek_rope_rotates_interleaved_pairs_with_vllms_yarn_scales():
    rope = DeepseekRope(KIMI_HEAD, 64, "head")
    f = 64.0  # K2.6's factor, mscale and mscale_all_dim 1: unit magnitude, softmax scale times (0.1 ln f + 1)^2
    assert rope.magnitude == pytest.approx(1.0)
    assert rope.softmax_factor == pytest.approx((0.1 * math.log(f) + 1) ** 2)
    x = torch.randn(1, 3, 2, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([[0, 5, 4095]])
    cos, sin = rope.cos_sin(pos)
    y = DeepseekRope.apply(x, cos.double(), sin.double())
    # as complex numbers: pair (2d, 2d+1) turned by the angle of frequency d
    z = torch.view_as_complex(x.reshape(1, 3, 2, 32, 2).contiguous())
    ang = torch.complex(cos[..., ::2].double(), sin[..., ::2].double())
    want = torch.view_as_real(z * ang[:, :, None]).reshape(1, 3, 2, 64)
    assert torch.allclose(y, want, atol=1e-9)
    assert torch.allclose(y[:, 0], x[:, 0])  # position 0 turns nothing


def test_the_heads_tensors_are_the_ones_vllms_loader_reads():
    head = Eagle3Head.from_config(KIMI_HEAD)
    m = Eagle3Drafter(head, torch.zeros(head.vocab_size, head.hidden_size), 3, draft_ids=torch.arange(512) * 2)
    state = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert state == head.expected_tensors(3)
    assert torch.equal(m.state_dict()["d2t"], torch.arange(512))  # target = draft + d2t


def test_a_head_trained_on_a_few_sequences_drafts_them():
    torch.manual_seed(0)
    head = small("mla", draft_vocab_size=64)
    m = Eagle3Drafter(head, torch.randn(64, 32), 3)
    tokens = torch.randint(0, 64, (4, 24))
    mask = torch.ones_like(tokens)
    mask[:, :4] = 0
    lengths = torch.full((4,), 24)
    feats = torch.randn(4, 24, 96)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    first = None
    for _ in range(150):
        loss, info = ttt_loss(m, tokens, mask, lengths, feats, 3, 4.0, None)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first / 4, (first, loss.item())
    drafts = draft_chains(m, tokens, feats, 3)
    truth = torch.stack([tokens[:, 5 + j : 21 + j] for j in range(3)], -1)  # rows 3..18 predict x_{r+2+j}
    assert (drafts[:, 3:19] == truth).float().mean() > 0.9
