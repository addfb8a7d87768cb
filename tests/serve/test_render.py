"""Golden argv and environment for every production config.

A change to what the recipe runs on MI300X shows up as a diff of
tests/golden/render/*.json. Regenerate deliberately with UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kimidflash.config import ConfigError, load_config
from kimidflash.config.rules import RENDERED_FLAGS
from kimidflash.render import attention_line, render

from ..support.helpers import ALL_CONFIGS, CONFIGS, PRODUCTION_CONFIGS, ROOT, UPDATE_GOLDEN

GOLDEN = ROOT / "tests" / "golden" / "render"


@pytest.mark.parametrize("name", PRODUCTION_CONFIGS)
def test_golden_argv_and_env(name):
    r = render(load_config(CONFIGS / name, environ={}))
    got = {"argv": r.argv, "env": r.env}
    path = GOLDEN / name.replace(".env", ".json")
    if UPDATE_GOLDEN:
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(path.read_text())


def test_speculative_config_is_json_with_the_draft_and_k():
    r = render(load_config(CONFIGS / "production-fp8kv-matched.env", environ={}))
    spec = json.loads(r.argv[r.argv.index("--speculative-config") + 1])
    assert spec == {
        "method": "dflash",
        "model": "/models/Kimi-K2.6-DFlash-matched",
        "num_speculative_tokens": 8,
        "attention_backend": "ROCM_ATTN",
        "kv_cache_dtype": "auto",
    }


def test_draft_kv_cache_dtype_is_rendered_only_where_vllm_has_the_option():
    """speculative_config.kv_cache_dtype exists in 0.32/0.33, not in 0.20.x, whose
    draft cache is BF16 anyway: the key stays off the command line there."""
    for pin, rendered in (("0.20.2", None), ("0.33.0", "auto")):
        config = load_config(CONFIGS / "production-fp8kv.env", {"VLLM_VERSION": pin}, environ={})
        argv = render(config).argv
        assert json.loads(argv[argv.index("--speculative-config") + 1]).get("kv_cache_dtype") == rendered


def test_tool_strict_level_is_rendered_only_where_vllm_has_the_flag():
    """--tool-strict-level exists from 0.32 (read in 0.32.0 and 0.33.0), not in 0.20.2 or 0.21.0,
    where required and named calls take the JSON-schema path instead; the shipped Kimi configs
    hold every tool to its schema."""
    for pin, rendered in (("0.20.2", False), ("0.21.0", False), ("0.32.0", True), ("0.33.0", True)):
        argv = render(load_config(CONFIGS / "production.env", {"VLLM_VERSION": pin}, environ={})).argv
        assert ("--tool-strict-level" in argv) == rendered, pin
        if rendered:
            assert argv[argv.index("--tool-strict-level") + 1] == "parameter"
    tiny = render(load_config(CONFIGS / "cpu-kimi-tiny.env", environ={})).argv
    assert tiny[tiny.index("--tool-strict-level") + 1] == "parameter"
    assert "--tool-strict-level" not in render(load_config(CONFIGS / "cpu-reference.env", environ={})).argv


def test_the_draft_schedule_renders_as_vllms_per_batch_size_list():
    """NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE becomes speculative_config.num_speculative_tokens_per_batch_size
    (inclusive [from, to, k] ranges) on the pins that have it; with data parallelism of 1 it stays."""
    for name, pin in (("production.env", "0.33.0"), ("cpu-reference.env", "0.32.0")):
        config = load_config(
            CONFIGS / name,
            {
                "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": "1-2:2,3-8:1,9-32:0",
                "MAX_NUM_SEQS": "32",
                "NUM_SPECULATIVE_TOKENS": "2",
                "EXTRA_VLLM_ARGS": "--data-parallel-size 1",
            },
            environ={},
        )
        assert config.vllm_version == pin
        argv = render(config).argv
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec["num_speculative_tokens"] == 2
        assert spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 2], [3, 8, 1], [9, 32, 0]]
    argv = render(load_config(CONFIGS / "production.env", environ={})).argv
    assert "num_speculative_tokens_per_batch_size" not in argv[argv.index("--speculative-config") + 1]


def test_a_schedule_is_inert_where_nothing_drafts(tmp_path):
    """No speculation (the baseline a sweep adds) and the training pipeline's hidden-state capture serve a
    config that ships a schedule as they would without it; a static k needs the schedule emptied."""
    sched = {"NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": "1-1:3,2-8:0", "NUM_SPECULATIVE_TOKENS": "3"}
    assert (
        "--speculative-config"
        not in render(
            load_config(CONFIGS / "cpu-reference.env", {**sched, "SPECULATIVE_METHOD": "none"}, environ={})
        ).argv
    )
    argv = render(
        load_config(
            CONFIGS / "cpu-reference.env",
            {
                **sched,
                "SPECULATIVE_METHOD": "extract_hidden_states",
                "HIDDEN_STATES_DIR": str(tmp_path),
                "HIDDEN_STATES_LAYERS": "1,2",
            },
            environ={},
        )
    ).argv
    assert "per_batch_size" not in argv[argv.index("--speculative-config") + 1]
    with pytest.raises(
        ConfigError, match=r"or for a static k empty it \(--set NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=\)"
    ):
        load_config(CONFIGS / "cpu-reference.env", {**sched, "NUM_SPECULATIVE_TOKENS": "2"}, environ={})
    static = load_config(
        CONFIGS / "cpu-reference.env",
        {**sched, "NUM_SPECULATIVE_TOKENS": "2", "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": ""},
        environ={},
    )
    assert "per_batch_size" not in render(static).argv[render(static).argv.index("--speculative-config") + 1]


def test_a_schedule_reads_back_as_it_is_written():
    from kimidflash.config import draft_schedule, format_schedule

    assert draft_schedule("1-2:3, 3-64:0") == ((1, 2, 3), (3, 64, 0))
    assert format_schedule(draft_schedule("1-2:3,3-64:0")) == "1-2:3,3-64:0"


def test_a_scales_file_seeds_running_max_through_the_environment(tmp_path):
    from kimidflash.formats.kv_scales import KvScales, LayerScale

    path = tmp_path / "scales.json"
    KvScales("mla", (LayerScale(0, 4.0, None, 4.0, 1.0),), 1.25, 10, 1).save(path)
    config = load_config(CONFIGS / "production-fp8kv.env", {"KV_SCALES_FILE": str(path)}, environ={})
    env = render(config).env
    assert env["KIMIDFLASH_FP8_KV_SCALE"] == "running-max" and env["KIMIDFLASH_FP8_KV_SCALES"] == str(path)
    assert "KIMIDFLASH_FP8_KV_SCALES" not in render(load_config(CONFIGS / "production-fp8kv.env", environ={})).env


def test_draft_backend_is_rendered_only_where_vllm_has_the_option():
    """0.20.x's SpeculativeConfig refuses unknown keys: nothing is rendered there, and
    the dry run says which backend the draft gets and how."""
    for pin, rendered in (("0.20.2", None), ("0.33.0", "ROCM_ATTN"), ("0.21.0", "ROCM_ATTN")):
        config = load_config(CONFIGS / "production.env", {"VLLM_VERSION": pin}, environ={})
        argv = render(config).argv
        assert json.loads(argv[argv.index("--speculative-config") + 1]).get("attention_backend") == rendered
    legacy = load_config(CONFIGS / "production.env", {"VLLM_VERSION": "0.20.2"}, environ={})
    assert attention_line(legacy) == (
        "attention: target TRITON_MLA (--attention-backend); DFlash draft ROCM_ATTN "
        "(ROCm's order, after P5 drops the inherited --attention-backend)"
    )


def test_baseline_and_ngram_and_draft_backend_render(tmp_path):
    base = tmp_path / "b.env"
    base.write_text(f"INCLUDE={CONFIGS / 'production.env'}\nSPECULATIVE_METHOD=none\n")
    assert "--speculative-config" not in render(load_config(base, environ={})).argv
    ng = tmp_path / "n.env"
    ng.write_text(f"INCLUDE={CONFIGS / 'production.env'}\nSPECULATIVE_METHOD=ngram\nNUM_SPECULATIVE_TOKENS=3\n")
    argv = render(load_config(ng, environ={})).argv
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    db = tmp_path / "d.env"
    db.write_text(f"INCLUDE={CONFIGS / 'production.env'}\nDRAFT_ATTENTION_BACKEND=TRITON_ATTN\n")
    argv = render(load_config(db, environ={})).argv
    assert json.loads(argv[argv.index("--speculative-config") + 1])["attention_backend"] == "TRITON_ATTN"


def test_moe_backend_switches_aiter_env():
    aiter = render(load_config(CONFIGS / "production-fp8kv.env", environ={})).env
    triton = render(load_config(CONFIGS / "production-fp8kv-safe.env", environ={})).env
    assert (aiter["VLLM_ROCM_USE_AITER_MOE"], triton["VLLM_ROCM_USE_AITER_MOE"]) == ("1", "0")
    assert aiter["KIMIDFLASH_FP8_KV_SCALE"] == "running-max"


def test_cpu_thread_binding_goes_to_vllm_through_the_environment():
    bound = render(
        load_config(CONFIGS / "cpu-tiny.env", {"TENSOR_PARALLEL_SIZE": "2", "CPU_OMP_THREADS_BIND": "0|1"}, environ={})
    ).env
    assert bound["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in render(load_config(CONFIGS / "cpu-tiny.env", environ={})).env


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_dry_run_prints_the_command_and_skips_host_checks(name):
    """--dry-run works on any machine: no /dev/kfd, no models, no venv needed."""
    r = subprocess.run(
        [sys.executable, "-m", "kimidflash", "serve", f"configs/{name}", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    rendered = render(load_config(CONFIGS / name, environ={}))
    flat = r.stdout.replace("\\\n", " ")
    for k, v in rendered.env.items():
        assert f"{k}={v}" in flat
    assert "--served-model-name" in flat and rendered.argv[0] in flat
    assert f"# {attention_line(load_config(CONFIGS / name, environ={}))}" in r.stdout


@pytest.mark.parametrize("name", ALL_CONFIGS)
@pytest.mark.parametrize("entrypoint", ["cli", "module"])
def test_every_rendered_flag_is_one_the_schema_names(name, entrypoint):
    """render takes its flag names from the schema, so the validator's list covers them all."""
    argv = render(load_config(CONFIGS / name, {"VLLM_ENTRYPOINT": entrypoint}, environ={})).argv
    flags = [w for w in argv if w.startswith("--")]
    assert flags and set(flags) <= set(RENDERED_FLAGS)


def test_capture_serving_renders_vllms_extract_hidden_states_and_its_connector():
    """Layer id L (a drafter's target_layer_ids) is vLLM's aux layer L + 1; no drafting
    happens, so benchmarks do not count it as speculative."""
    cfg = load_config(
        CONFIGS / "cpu-reference.env",
        {
            "SPECULATIVE_METHOD": "extract_hidden_states",
            "HIDDEN_STATES_DIR": "/run/hs",
            "HIDDEN_STATES_LAYERS": "1,8,28",
        },
        environ={},
    )
    argv = render(cfg).argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 9, 29]}},
    }
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector"
    assert kv["kv_connector_extra_config"] == {"shared_storage_path": "/run/hs"}
    assert not cfg.speculative
    assert "--kv-transfer-config" not in render(load_config(CONFIGS / "cpu-reference.env", environ={})).argv
