"""A short self-synthesis chunk through the served CPU reference target (SmolLM2 in float32, no
speculation: the structured-output and benchmark modules' shared server), from its own chat
template's user prefix: requests the target wrote, answered greedily, as regen records."""

from __future__ import annotations

import pytest

from kimidflash.config import load_config
from kimidflash.prompts_real.sets import humaneval_set
from kimidflash.train.data import read_shard, verify_shards
from kimidflash.train.selfsynth import Settings, synthesize
from kimidflash.train.selfsynth_cli import template_of

from ..support.helpers import CONFIGS, SERVE_SH, api_client

pytestmark = pytest.mark.slow

REFERENCE = CONFIGS / "cpu-reference.env"


def test_the_served_target_writes_requests_and_answers_them_greedily(shared_server, tmp_path):
    server = shared_server.get(REFERENCE, "DTYPE=float32", "SPECULATIVE_METHOD=none", cmd=SERVE_SH)
    config = load_config(REFERENCE)
    template = template_of(config.model_dir, config.chat_template)
    assert template.prefix.endswith("<|im_start|>user\n") and template.stop == "<|im_end|>"
    settings = Settings(config.served_model_name, per_shard=16, user_max_tokens=96, answer_max_tokens=48)
    evals = {"humaneval": [t for r in humaneval_set().records for t in r["turns"]]}
    doc = synthesize(server.base_url, tmp_path, template, settings, 1, evals, concurrency=8, log=print)
    (entry,) = verify_shards(tmp_path)["shards"]
    assert entry["requested"] == 16 and entry["kept"] + sum(entry["refused"].values()) == 16
    recs = read_shard(tmp_path / entry["file"])
    assert len(recs) >= 8, entry  # most sampled requests are usable
    assert len({r.prompt for r in recs}) == len(recs)
    # not one request over and over: a small model opens many requests alike ("Can you", "I'm"; 4 distinct
    # first two words in 16 in CI's run), so the check is on the word pairs within them
    assert doc["diversity"]["kept"]["distinct"][2] > 0.5 and doc["diversity"]["kept"]["openings"] >= 3, doc["diversity"]
    with api_client(server.base_url, 600) as client:  # each answer is the target's greedy one, token for token
        for r in recs[:3]:
            js = client.post(
                "/v1/chat/completions",
                json={
                    "model": config.served_model_name,
                    "messages": [{"role": "user", "content": r.prompt}],
                    "max_tokens": 48,
                    "temperature": 0,
                    "return_token_ids": True,
                },
            ).json()
            assert js["prompt_token_ids"] + js["choices"][0]["token_ids"] == r.input_ids
