""" "Zero quality loss": greedy outputs with speculation equal those without, token for token.

Run in float32: bfloat16 greedy outputs on CPU change with batch shape, which
would blame speculation for rounding. Requests go 8 at a time so the
verification path sees mixed batches. ngram speculation is included because
it accepts many tokens (the random DFlash drafter almost none), so accepted
drafts are proven to change nothing too.

`extra` (-m extra): the same check runs in CI on the two models that matter more, with
drafters that are accepted: SmolLM2 with the shipped drafter (test_train_slow.py, and
every structured kind in test_structured_slow.py) and the tiny K2.6 on its MLA target
(test_cpu_kimi_slow.py). This one, on the generic tiny pair, is left out for CI's time.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from ..conftest import serving
from ..support.helpers import api_client

pytestmark = [pytest.mark.slow, pytest.mark.extra]

TOPICS = [
    "the cache",
    "a drafter",
    "GPUs",
    "prime numbers",
    "the sky",
    "a detective story",
    "tokens",
    "the server",
    "rivers",
    "music",
    "chess",
    "bread",
    "volcanoes",
]
FORMS = [
    "Explain {} in one sentence.",
    "Write a haiku about {}.",
    "List three facts about {}.",
    "Repeat after me: {} {} {} {}.",
]
PROMPTS = [f.format(*[t] * f.count("{}")) for t in TOPICS for f in FORMS][:52]
MAX_TOKENS = 48


def greedy_outputs(base_url: str) -> list[list[int]]:
    def one(prompt: str) -> list[int]:
        r = client.post(
            "/v1/chat/completions",
            json={
                "model": "tiny-qwen3-dflash",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "return_token_ids": True,
                "ignore_eos": True,
            },
        )
        r.raise_for_status()
        return r.json()["choices"][0]["token_ids"]

    with api_client(base_url, 300) as client, ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, PROMPTS))


def accepted(server) -> float:
    return server.metrics().get("vllm:spec_decode_num_accepted_tokens_total", 0.0)


def test_speculation_changes_no_token(cpu_tiny_config):
    assert len(set(PROMPTS)) >= 50
    runs = {}
    for method in ("none", "dflash", "ngram"):
        with serving(cpu_tiny_config, "DTYPE=float32", f"SPECULATIVE_METHOD={method}") as server:
            runs[method] = greedy_outputs(server.base_url)
            runs[method + ":accepted"] = accepted(server)
    assert all(len(ids) == MAX_TOKENS for ids in runs["none"])
    for method in ("dflash", "ngram"):
        diffs = [i for i, (a, b) in enumerate(zip(runs["none"], runs[method], strict=False)) if a != b]
        assert diffs == [], f"{method}: prompts {diffs} differ from the autoregressive run"
    assert runs["ngram:accepted"] > 0, "ngram accepted nothing: the verification path was not exercised"
