"""The schema, the shipped configs and every refusal, with its message."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kimidflash.config import FIELDS, ConfigError, check_checkpoints, check_config, load_config, rules
from kimidflash.config.loader import coerce

from ..support.helpers import ALL_CONFIGS, CONFIGS, ROOT, write_env


def test_every_field_is_documented_and_its_default_is_valid():
    for f in FIELDS:
        assert f.doc and f.group, f.name
        if f.default != "" and f.kind != "path":
            raw = str(f.default).lower() if f.kind == "bool" else str(f.default)
            assert coerce(f, raw, "default") == f.default, f.name


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_shipped_configs_validate(name):
    config = load_config(CONFIGS / name, environ={})
    assert config.host == "127.0.0.1"
    assert not config.api_key


def test_production_values_match_the_seed():
    c = load_config(CONFIGS / "production.env", environ={})
    assert (c.kv_cache_dtype, c.moe_backend, c.max_num_seqs, c.num_speculative_tokens) == (
        "auto",
        "aiter",
        32,
        2,
    )
    assert (c.max_num_batched_tokens, c.max_model_len, c.gpu_memory_utilization, c.block_size) == (
        32768,
        262144,
        0.90,
        16,
    )
    assert (c.enforce_eager, c.tensor_parallel_size, c.port, c.served_model_name) == (
        True,
        8,
        8262,
        "kimi-k2.6-amd-dflash",
    )
    fp8 = load_config(CONFIGS / "production-fp8kv.env", environ={})
    assert (fp8.kv_cache_dtype, fp8.max_num_seqs, fp8.kv_scale_policy) == ("fp8", 64, "running-max")
    safe = load_config(CONFIGS / "production-fp8kv-safe.env", environ={})
    assert (safe.kv_cache_dtype, safe.moe_backend) == ("fp8", "triton")
    matched = load_config(CONFIGS / "production-fp8kv-matched.env", environ={})
    assert (matched.kv_cache_dtype, matched.num_speculative_tokens, matched.max_num_seqs) == ("fp8", 8, 64)
    assert matched.draft_model_dir != c.draft_model_dir


def test_include_chain_records_where_each_value_came_from():
    c = load_config(CONFIGS / "production-fp8kv-safe.env", environ={})
    assert c.sources["MOE_BACKEND"].endswith("production-fp8kv-safe.env")
    assert c.sources["KV_CACHE_DTYPE"].endswith("production-fp8kv.env")
    assert c.sources["PORT"].endswith("production.env")
    assert c.sources["HEALTH_TIMEOUT"] == "default"
    assert [p.name for p in c.files] == ["production.env", "production-fp8kv.env", "production-fp8kv-safe.env"]


def test_draft_config_json_is_the_seed_architecture():
    d = json.loads((CONFIGS / "kimi-k2.6-dflash-draft.json").read_text())
    assert d["num_hidden_layers"] == 6
    assert d["dflash_config"]["target_layer_ids"] == [1, 12, 24, 35, 47, 58]
    assert (d["training"]["block_size"], d["block_size"]) == (16, 8)
    assert set(d["training"]["shared_frozen"]) == {"embed_tokens", "lm_head"}


def test_relative_paths_resolve_from_the_env_file(tmp_path):
    (tmp_path / "d.json").write_text('{"block_size": 4}')
    env = write_env(
        tmp_path / "x.env",
        "INCLUDE=" + str(CONFIGS / "production.env") + "\nDRAFT_CONFIG=d.json\nNUM_SPECULATIVE_TOKENS=4\n",
    )
    assert load_config(env, environ={}).draft_config == str(tmp_path / "d.json")


def test_api_key_comes_from_the_environment_and_is_masked(tmp_path):
    env = write_env(tmp_path / "x.env", f"INCLUDE={CONFIGS / 'production.env'}\nHOST=0.0.0.0\n")
    c = load_config(env, environ={"API_KEY": "s3cret"})
    assert c.api_key == "s3cret" and c.sources["API_KEY"] == "process environment"
    from kimidflash.render import render

    r = render(c)
    assert r.env["VLLM_API_KEY"] == "s3cret"
    assert "s3cret" not in " ".join(r.argv) and "s3cret" not in r.shell()


def refusal(tmp_path, body: str, environ=None) -> ConfigError:
    env = write_env(tmp_path / "bad.env", f"INCLUDE={CONFIGS / 'production.env'}\n{body}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(env, environ=environ or {})
    return exc.value


@pytest.mark.parametrize(
    "body, key, words",
    [
        ("MAX_NUM_SEQ=8", "MAX_NUM_SEQ", ["unknown key", "did you mean MAX_NUM_SEQS"]),
        ("MAX_NUM_SEQS=many", "MAX_NUM_SEQS", ["expected an integer", "'many'"]),
        ("ENFORCE_EAGER=maybe", "ENFORCE_EAGER", ["true or false"]),
        ("GPU_MEMORY_UTILIZATION=1.5", "GPU_MEMORY_UTILIZATION", ["out of range"]),
        ("PORT=70000", "PORT", ["out of range"]),
        ("KV_CACHE_DTYPE=fp9", "KV_CACHE_DTYPE", ["not one of", "did you mean 'fp8'"]),
        ("MAX_NUM_BATCHED_TOKENS=65536", "MAX_NUM_BATCHED_TOKENS", ["384-expert", "32768", "MOE_BACKEND=triton"]),
        ("NUM_SPECULATIVE_TOKENS=9", "NUM_SPECULATIVE_TOKENS", ["outside 1..8", "kimi-k2.6-dflash-draft.json"]),
        ("BLOCK_SIZE=32", "BLOCK_SIZE", ["MLA", "BLOCK_SIZE=16"]),
        (
            "KV_CACHE_DTYPE=fp8",
            "KV_SCALE_POLICY",
            [
                "KV_SCALE_POLICY=running-max for an MLA target",
                "scale 1.0",
                "KV_SCALE_POLICY=checkpoint for a standard-attention",
                "13133",
            ],
        ),
        # FP8 KV (docs/fp8-kv.md): policies that mean what they say, the draft's cache per pin.
        (
            "KV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max\nDRAFT_KV_CACHE_DTYPE=auto\nENFORCE_EAGER=false",
            "ENFORCE_EAGER",
            ["host", "graph capture", "ENFORCE_EAGER=true"],
        ),
        (
            "KV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max\nDRAFT_KV_CACHE_DTYPE=auto\nTARGET_ATTENTION=standard",
            "KV_SCALE_POLICY",
            ["MLA cache writes only", "checkpoint"],
        ),
        (
            "KV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=checkpoint\nDRAFT_KV_CACHE_DTYPE=auto",
            "KV_SCALE_POLICY",
            ["MLA target", "isinstance(layer, Attention)", "KV_SCALE_POLICY=running-max", "KV_SCALES_FILE"],
        ),
        (
            "KV_CACHE_DTYPE=fp8_e5m2\nKV_SCALE_POLICY=checkpoint\nDRAFT_KV_CACHE_DTYPE=auto\nTARGET_ATTENTION=standard",
            "KV_CACHE_DTYPE",
            ["fp8_e5m2", "KV_CACHE_DTYPE=fp8"],
        ),
        ("KV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max", "DRAFT_KV_CACHE_DTYPE", ["scale 1.0", "auto", "fp8"]),
        (
            "VLLM_VERSION=0.20.2\nKV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max\nDRAFT_KV_CACHE_DTYPE=fp8",
            "DRAFT_KV_CACHE_DTYPE",
            ["without the cache config", "stays BF16", "42692"],
        ),
        ("VLLM_VERSION=0.25.0\nDRAFT_KV_CACHE_DTYPE=auto", "DRAFT_KV_CACHE_DTYPE", ["from vLLM 0.32 on", "0.25.0"]),
        (
            "SPECULATIVE_METHOD=none\nDRAFT_KV_CACHE_DTYPE=auto",
            "DRAFT_KV_CACHE_DTYPE",
            ["a draft model", "dflash or eagle3"],
        ),
        (
            "KV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=checkpoint\nDRAFT_KV_CACHE_DTYPE=auto\nTARGET_ATTENTION=standard\n"
            "KV_SCALES_FILE=x.json",
            "KV_SCALES_FILE",
            ["KV_SCALE_POLICY=running-max", "--overlay"],
        ),
        (
            "KV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max\nDRAFT_KV_CACHE_DTYPE=auto\nKV_SCALES_FILE=/nonexistent/s.json",
            "KV_SCALES_FILE",
            ["/nonexistent/s.json", "not found"],
        ),
        ("KV_SCALE_POLICY=running-max", "KV_SCALE_POLICY", ["only to an FP8 KV cache"]),
        ("HOST=0.0.0.0", "HOST", ["API_KEY", "127.0.0.1"]),
        ("EXTRA_VLLM_ARGS=--max-num-seqs 4", "EXTRA_VLLM_ARGS", ["repeats --max-num-seqs"]),
        ("EXTRA_VLLM_ARGS='--foo \"unbalanced'", "EXTRA_VLLM_ARGS", ["shell words"]),
        ("PLATFORM=cpu", "MOE_BACKEND", ["MOE_BACKEND=auto"]),
        (
            "PLATFORM=cpu\nMOE_BACKEND=auto\nSPECULATIVE_METHOD=none\nDTYPE=float32",
            "ATTENTION_BACKEND",
            [
                "TRITON_MLA with an MLA target in float32",
                "AMX_MLA",
                "bfloat16 weights only",
                "ATTENTION_BACKEND=CPU_MLA",
            ],
        ),
        ("CPU_OMP_THREADS_BIND=0|1", "CPU_OMP_THREADS_BIND", ["only applies with PLATFORM=cpu"]),
        (
            "PLATFORM=cpu\nMOE_BACKEND=auto\nCPU_OMP_THREADS_BIND=0|1",
            "CPU_OMP_THREADS_BIND",
            ["2 CPU list(s)", "one per rank, TENSOR_PARALLEL_SIZE=8"],
        ),
        (
            "PLATFORM=cpu\nMOE_BACKEND=auto\nTENSOR_PARALLEL_SIZE=2\nCPU_OMP_THREADS_BIND=0-3|4,x",
            "CPU_OMP_THREADS_BIND",
            ["'4,x'", "not a CPU list"],
        ),
        ("HIDDEN_STATES_DIR=/x", "HIDDEN_STATES_DIR", ["SPECULATIVE_METHOD=extract_hidden_states only"]),
        ("SPECULATIVE_METHOD=extract_hidden_states\nHIDDEN_STATES_LAYERS=1", "HIDDEN_STATES_DIR", ["folder"]),
        (
            "SPECULATIVE_METHOD=extract_hidden_states\nHIDDEN_STATES_DIR=/x",
            "HIDDEN_STATES_LAYERS",
            ["target_layer_ids"],
        ),
        (
            "SPECULATIVE_METHOD=extract_hidden_states\nHIDDEN_STATES_DIR=/x\nHIDDEN_STATES_LAYERS=1,a",
            "HIDDEN_STATES_LAYERS",
            ["'a'", "not a layer id"],
        ),
        (
            "SPECULATIVE_METHOD=extract_hidden_states\nHIDDEN_STATES_DIR=/x\nHIDDEN_STATES_LAYERS=1,1",
            "HIDDEN_STATES_LAYERS",
            ["twice"],
        ),
        (
            "SPECULATIVE_METHOD=ngram\nNGRAM_PROMPT_LOOKUP_MIN=4\nNGRAM_PROMPT_LOOKUP_MAX=2",
            "NGRAM_PROMPT_LOOKUP_MIN",
            ["must not exceed"],
        ),
        # The per-batch-size draft schedule (production.env: MAX_NUM_SEQS=32, NUM_SPECULATIVE_TOKENS=2).
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-4:2,5-x:0",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["'5-x:0'", "not FROM-TO:K"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=2-32:2",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["2-32:2 starts at 2", "must start at 1"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-4:2,4-32:0",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["4-32:0 starts at 4", "without gaps or overlap", "must start at 5"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-4:2,6-32:0",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["6-32:0 starts at 6", "must start at 5"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-4:2,5-3:0",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["5-3:0 ends before it starts"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-4:3,5-32:0",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["1-4:3 drafts 3 tokens", "NUM_SPECULATIVE_TOKENS=2"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-4:2,5-16:0",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["ends at batch size 16", "MAX_NUM_SEQS=32"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-32:2,33-64:0",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["33-64:0 starts above MAX_NUM_SEQS=32"],
        ),
        ("TOOL_CALL_PARSER=\nTOOL_STRICT_LEVEL=parameter", "TOOL_STRICT_LEVEL", ["TOOL_CALL_PARSER is empty"]),
        ("TOOL_STRICT_LEVEL=strict", "TOOL_STRICT_LEVEL", ["parameter"]),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-32:2\nVLLM_VERSION=0.20.2",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["vLLM 0.20.2 has no num_speculative_tokens_per_batch_size", "0.25.1", "32374"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-32:2\nSPECULATIVE_METHOD=ngram",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["SPECULATIVE_METHOD=dflash", "not ngram"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-32:2\nEXTRA_VLLM_ARGS=--data-parallel-size=2",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["data parallelism", "--data-parallel-size=2", "deadlock"],
        ),
        (
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-32:2\nEXTRA_VLLM_ARGS='-dp 4'",
            "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE",
            ["data parallelism", "-dp 4"],
        ),
        # Attention backends the pin cannot honour (kimidflash.backends.refusal).
        (
            "VLLM_VERSION=0.20.2\nDRAFT_ATTENTION_BACKEND=TRITON_ATTN",
            "DRAFT_ATTENTION_BACKEND",
            ["vLLM 0.20.2 has no per-draft backend option", "it gets ROCM_ATTN", "DRAFT_ATTENTION_BACKEND=ROCM_ATTN"],
        ),
        ("DRAFT_ATTENTION_BACKEND=ROCM_AITER_FA", "DRAFT_ATTENTION_BACKEND", ["causal=True", "use ROCM_ATTN"]),
        ("VLLM_VERSION=0.20.2\nDRAFT_ATTENTION_BACKEND=ROCM_AITER_FA", "DRAFT_ATTENTION_BACKEND", ["causal=True"]),
        ("DRAFT_ATTENTION_BACKEND=ROCM_AITER_UNIFIED_ATTN", "DRAFT_ATTENTION_BACKEND", ["no non-causal support"]),
        ("DRAFT_ATTENTION_BACKEND=TRITON_MLA", "DRAFT_ATTENTION_BACKEND", ["MLA backend", "standard attention"]),
        (
            "VLLM_VERSION=0.20.2\nATTENTION_BACKEND=",
            "ATTENTION_BACKEND",
            ["vLLM 0.20.2", "ATTENTION_BACKEND=TRITON_MLA"],
        ),
        (
            "VLLM_VERSION=0.20.2\nATTENTION_BACKEND=ROCM_AITER_MLA",
            "ATTENTION_BACKEND",
            ["ATTENTION_BACKEND=TRITON_MLA"],
        ),
    ],
)
def test_refusals_name_the_key_and_the_fix(tmp_path, body, key, words):
    err = refusal(tmp_path, body)
    assert err.key == key
    for w in words:
        assert w in str(err), (w, str(err))


@pytest.mark.parametrize(
    "body",
    [
        "VLLM_VERSION=0.20.2",  # ROCM_ATTN is what 0.20.x picks itself: accepted, not rendered
        "VLLM_VERSION=0.20.2\nDRAFT_ATTENTION_BACKEND=",
        "DRAFT_ATTENTION_BACKEND=TRITON_ATTN",  # from 0.21 the draft's backend is the config's to name
        "DRAFT_ATTENTION_BACKEND=\nATTENTION_BACKEND=",
        "SPECULATIVE_METHOD=none\nVLLM_VERSION=0.20.2\nATTENTION_BACKEND=",  # no draft, no rule
        # float32 MLA on CPU names the reference backend; bfloat16 may take AMX_MLA (vLLM's pick)
        "PLATFORM=cpu\nMOE_BACKEND=auto\nSPECULATIVE_METHOD=none\nDTYPE=float32\nATTENTION_BACKEND=cpu_mla",
        "PLATFORM=cpu\nMOE_BACKEND=auto\nSPECULATIVE_METHOD=none\nDTYPE=bfloat16\nATTENTION_BACKEND=",
    ],
)
def test_attention_backends_each_pin_honours_are_accepted(tmp_path, body):
    load_config(write_env(tmp_path / "ok.env", f"INCLUDE={CONFIGS / 'production.env'}\n{body}\n"), environ={})


@pytest.mark.parametrize(
    "body",
    [
        # 0.20.x keeps the draft cache BF16 by itself: nothing to choose, auto is a no-op.
        "VLLM_VERSION=0.20.2\nKV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max",
        "VLLM_VERSION=0.20.2\nKV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max\nDRAFT_KV_CACHE_DTYPE=auto",
        "KV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max\nDRAFT_KV_CACHE_DTYPE=fp8",  # chosen, at the user's risk
        "KV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=checkpoint\nDRAFT_KV_CACHE_DTYPE=auto\nTARGET_ATTENTION=standard",
        "SPECULATIVE_METHOD=ngram\nKV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max",  # no draft cache
    ],
)
def test_fp8_settings_each_pin_honours_are_accepted(tmp_path, body):
    load_config(write_env(tmp_path / "ok.env", f"INCLUDE={CONFIGS / 'production.env'}\n{body}\n"), environ={})


def test_kv_scales_file_is_read_and_checked_against_the_checkpoint(tmp_path):
    from kimidflash.formats.kv_scales import KvScales, LayerScale

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"model_type": "deepseek_v3", "kv_lora_rank": 512, "num_hidden_layers": 3})
    )
    good = tmp_path / "good.json"
    KvScales("mla", tuple(LayerScale(i, 4.0, None, 4.0, 1.0) for i in range(3)), 1.25, 10, 1).save(good)
    base = f"MODEL_DIR={model}\nKV_CACHE_DTYPE=fp8\nKV_SCALE_POLICY=running-max\nDRAFT_KV_CACHE_DTYPE=auto\n"
    load_config(
        write_env(tmp_path / "ok.env", f"INCLUDE={CONFIGS / 'production.env'}\n{base}KV_SCALES_FILE={good}\n"),
        environ={},
    )
    short = tmp_path / "short.json"
    KvScales("mla", (LayerScale(0, 4.0, None, 4.0, 1.0),), 1.25, 10, 1).save(short)
    err = refusal(tmp_path, f"{base}KV_SCALES_FILE={short}")
    assert err.key == "KV_SCALES_FILE" and "1 layers" in str(err) and "has 3" in str(err)
    mha = tmp_path / "mha.json"
    KvScales("mha", tuple(LayerScale(i, 4.0, 2.0) for i in range(3)), 1.25, 10, 1).save(mha)
    err = refusal(tmp_path, f"{base}KV_SCALES_FILE={mha}")
    assert err.key == "KV_SCALES_FILE" and "mha scales" in str(err)


def test_a_checkpoint_with_kv_scales_refuses_a_bf16_cache(tmp_path):
    """vLLM turns an `auto` cache into FP8 when the checkpoint declares a
    kv_cache_scheme (attention.py, 0.20.2 and 0.33.0): auto would be a silent lie."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "deepseek_v3",
                "kv_lora_rank": 512,
                "quantization_config": {"kv_cache_scheme": {"num_bits": 8}},
            }
        )
    )
    err = refusal(tmp_path, f"MODEL_DIR={model}")
    assert err.key == "KV_CACHE_DTYPE" and "kv_cache_scheme" in str(err) and "KV_SCALE_POLICY=checkpoint" in str(err)


def test_refused_attention_settings_are_one_line(tmp_path):
    err = refusal(tmp_path, "VLLM_VERSION=0.20.2\nDRAFT_ATTENTION_BACKEND=TRITON_ATTN")
    assert "\n" not in str(err) and "`" not in str(err)


def test_aiter_cap_does_not_apply_to_triton_moe(tmp_path):
    env = write_env(
        tmp_path / "ok.env", f"INCLUDE={CONFIGS / 'production.env'}\nMOE_BACKEND=triton\nMAX_NUM_BATCHED_TOKENS=65536\n"
    )
    assert load_config(env, environ={}).max_num_batched_tokens == 65536


def test_target_attention_is_checked_against_the_checkpoint(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    err = refusal(tmp_path, f"MODEL_DIR={model}")
    assert err.key == "TARGET_ATTENTION" and "TARGET_ATTENTION=standard" in str(err)


def test_drafter_checkpoint_block_size_wins_over_the_architecture_json(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"block_size": 4}))
    err = refusal(tmp_path, f"DRAFT_MODEL_DIR={draft}\nNUM_SPECULATIVE_TOKENS=5")
    assert "outside 1..4" in str(err) and str(draft) in str(err)


def test_api_key_in_a_shipped_config_is_refused(tmp_path, monkeypatch):
    shipped = tmp_path / "configs"  # stands in for the checkout's configs/, which the test leaves alone
    shipped.mkdir()
    monkeypatch.setattr(rules, "CONFIGS_DIR", shipped)
    bad = write_env(shipped / "zz-test-api-key.env", f"INCLUDE={CONFIGS / 'production.env'}\nAPI_KEY=committed\n")
    with pytest.raises(ConfigError, match="export API_KEY"):
        load_config(bad, environ={})
    elsewhere = write_env(tmp_path / "mine.env", f"INCLUDE={CONFIGS / 'production.env'}\nAPI_KEY=mine\n")
    assert load_config(elsewhere, environ={}).api_key == "mine"


def test_include_cycle_is_refused(tmp_path):
    write_env(tmp_path / "a.env", "INCLUDE=b.env\n")
    write_env(tmp_path / "b.env", "INCLUDE=a.env\n")
    with pytest.raises(ConfigError, match="include cycle"):
        load_config(tmp_path / "a.env", environ={})


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["serve", "configs/nope.env", "--dry-run"], 2, ["does not exist"]),
        (
            ["serve", "configs/production.env", "--dry-run", "--set", "MAX_NUM_SEQ=4"],
            2,
            ["MAX_NUM_SEQ", "did you mean MAX_NUM_SEQS"],
        ),
        (["serve", "configs/production.env", "--dry-run", "--set", "HOST=10.0.0.5"], 2, ["HOST", "API_KEY"]),
    ],
)
def test_cli_refuses_with_one_line_and_exit_2(args, code, words):
    r = subprocess.run(
        [sys.executable, "-m", "kimidflash", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == code
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr


def test_print_config_shows_sources():
    r = subprocess.run(
        [sys.executable, "-m", "kimidflash", "serve", "configs/production-fp8kv.env", "--print-config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "250", "API_KEY": "zzz"},
    )
    assert r.returncode == 0, r.stderr
    lines = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if line.count("│") >= 3}
    assert "production-fp8kv.env" in lines["KV_CACHE_DTYPE"]
    assert "default" in lines["HEALTH_TIMEOUT"]
    assert "***" in lines["API_KEY"] and "zzz" not in r.stdout


def test_checkpoint_rules_run_apart_from_the_value_rules(tmp_path):
    """check_config reads no checkpoint; check_checkpoints sees one made after load
    (what serve relies on when prepare generates the models)."""
    draft = tmp_path / "draft"
    env = write_env(
        tmp_path / "c.env", f"INCLUDE={CONFIGS / 'production.env'}\nDRAFT_MODEL_DIR={draft}\nNUM_SPECULATIVE_TOKENS=5\n"
    )
    config = load_config(env, environ={})  # nothing at DRAFT_MODEL_DIR yet: nothing to refuse
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"block_size": 4}))
    check_config(config)
    with pytest.raises(ConfigError, match=r"outside 1\.\.4") as exc:
        check_checkpoints(config)
    assert exc.value.key == "NUM_SPECULATIVE_TOKENS"


def test_rendered_flags_come_from_the_schema():
    """The flags EXTRA_VLLM_ARGS may not repeat are the schema's, and none was lost
    when they moved there from a list of their own."""
    assert set(rules.RENDERED_FLAGS) == {
        "--model",
        "--served-model-name",
        "--host",
        "--port",
        "--api-key",
        "--tensor-parallel-size",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--block-size",
        "--enforce-eager",
        "--kv-cache-dtype",
        "--dtype",
        "--trust-remote-code",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--speculative-config",
        "--per-request-spec-decode-metrics",
        "--attention-backend",
        "--chat-template",
        "--tool-call-parser",
        "--enable-auto-tool-choice",
        "--tool-strict-level",
        "--reasoning-parser",
        "--load-format",
        "--kv-transfer-config",
    }
    assert len(rules.RENDERED_FLAGS) == len(set(rules.RENDERED_FLAGS))
    assert tuple(flag for f in FIELDS for flag in (*f.also, f.flag, f.flag_off) if flag) == rules.RENDERED_FLAGS


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--no-enable-prefix-caching", "--enable-auto-tool-choice"])
def test_extra_args_may_not_repeat_a_schema_flag(tmp_path, flag):
    err = refusal(tmp_path, f"EXTRA_VLLM_ARGS='{flag}=1'")
    assert err.key == "EXTRA_VLLM_ARGS" and f"repeats {flag}" in str(err)


def hidden_states_config(tmp_path, env: str, layers: str, text: dict, **more: str):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"text_config": text}))
    over = {
        "SPECULATIVE_METHOD": "extract_hidden_states",
        "HIDDEN_STATES_DIR": str(tmp_path / "hs"),
        "MODEL_DIR": str(model),
        "HIDDEN_STATES_LAYERS": layers,
        **more,
    }
    return load_config(CONFIGS / env, over, environ={})


def test_hidden_states_layers_may_name_the_last_layer_of_a_standard_target(tmp_path):
    """L-1 (the last layer's output, vLLM aux id L) is what speculators' DFlash reads as the
    verifier state; llama and qwen backbones capture it on every pin. Past it is refused."""
    text = {"num_hidden_layers": 4}
    for version in ("0.20.2", "0.32.0"):
        check_checkpoints(hidden_states_config(tmp_path, "cpu-tiny.env", "0,2,3", text, VLLM_VERSION=version))
    with pytest.raises(ConfigError, match=r"\[4\] beyond 3") as exc:
        check_checkpoints(hidden_states_config(tmp_path, "cpu-tiny.env", "0,4", text))
    assert exc.value.key == "HIDDEN_STATES_LAYERS"


MLA_TEXT = {"num_hidden_layers": 4, "kv_lora_rank": 512, "qk_rope_head_dim": 64}


@pytest.mark.parametrize("version", ["0.20.2", "0.21.0"])
def test_an_mla_target_names_its_last_layer_only_from_vllm_0_32(tmp_path, version):
    """deepseek_v2 (Kimi) drops the final-layer hidden state before vLLM PR 46973."""
    with pytest.raises(ConfigError) as exc:
        check_checkpoints(hidden_states_config(tmp_path, "cpu-kimi-tiny.env", "0,3", MLA_TEXT, VLLM_VERSION=version))
    assert exc.value.key == "HIDDEN_STATES_LAYERS"
    assert all(s in str(exc.value) for s in ("VLLM_VERSION", version, "PR 46973", "0.32.0"))
    check_checkpoints(hidden_states_config(tmp_path, "cpu-kimi-tiny.env", "0,2", MLA_TEXT, VLLM_VERSION=version))
    for ok in ("0.32.0", "0.33.0"):
        check_checkpoints(hidden_states_config(tmp_path, "cpu-kimi-tiny.env", "0,3", MLA_TEXT, VLLM_VERSION=ok))


def test_an_eagle3_mla_head_in_float32_on_cpu_names_its_own_backend():
    """vLLM gives the head AMX_MLA on a host with AMX too, which refused its float32 weights at load."""
    with pytest.raises(ConfigError) as err:
        load_config(CONFIGS / "cpu-kimi-tiny-eagle3.env", {"DRAFT_ATTENTION_BACKEND": ""}, environ={})
    assert err.value.key == "DRAFT_ATTENTION_BACKEND"
    for w in ("(empty) with an EAGLE-3 MLA head in float32 on CPU", "AMX_MLA", "DRAFT_ATTENTION_BACKEND=CPU_MLA"):
        assert w in str(err.value), w
    load_config(CONFIGS / "cpu-kimi-tiny-eagle3.env", {"DTYPE": "bfloat16", "DRAFT_ATTENTION_BACKEND": ""}, environ={})


def test_per_request_spec_metrics_are_asked_for_only_where_a_drafter_runs_and_only_on_pins_that_have_them():
    from kimidflash.render import render

    argv = render(load_config(CONFIGS / "cpu-reference.env", ["SPEC_DECODE_METRICS=summary"])).argv
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    none = load_config(CONFIGS / "cpu-reference.env", ["SPEC_DECODE_METRICS=summary", "SPECULATIVE_METHOD=none"])
    assert "--per-request-spec-decode-metrics" not in render(none).argv  # vLLM refuses it without speculation
    assert "--per-request-spec-decode-metrics" not in render(load_config(CONFIGS / "cpu-reference.env")).argv
    with pytest.raises(ConfigError, match=r"SPEC_DECODE_METRICS.*VLLM_VERSION is 0\.20\.2"):
        load_config(
            CONFIGS / "production.env", ["SPEC_DECODE_METRICS=summary", "VLLM_VERSION=0.20.2"], check_files=False
        )
