"""EAGLE-3 heads: the head's shape (eagle3.Eagle3Head), the serve rules that check it against its
target and tensors, its rendering and draft schedule, and the tiny K2.6 head's committed shape.
Fast tier: config files and safetensors headers only, no torch."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kimidflash import backends
from kimidflash.config import ConfigError, load_config
from kimidflash.cpu_reference import tiny_kimi
from kimidflash.eagle3 import AUX_IDS, Eagle3Error, Eagle3Head, default_aux_ids, served_architecture
from kimidflash.render import render

from ..support.helpers import CONFIGS, write_env

TINY_HEAD = json.loads((CONFIGS / "tiny-kimi-k2.6-eagle3-draft.json").read_text())
KIMI_HEAD = json.loads((CONFIGS / "kimi-k2.6-eagle3-mla-draft.json").read_text())
TINY_TARGET = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": dict(tiny_kimi.TEXT),
}
LLAMA_TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "num_attention_heads": 9,
}
LLAMA_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 576,
    "num_hidden_layers": 1,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "draft_vocab_size": 16384,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]},
}


def write_safetensors_header(path: Path, shapes: dict[str, list[int]]) -> None:
    """A safetensors file whose header lists `shapes` (the rules read headers only)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 8
        for d in shape:
            n *= d
        header[name] = {
            "dtype": "I64" if name == "d2t" else "F32",
            "shape": shape,
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def head_dir(root: Path, cfg: dict, shapes: dict | None = None) -> Path:
    d = root / "head"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    head = Eagle3Head.from_config(cfg)
    write_safetensors_header(
        d / "model.safetensors", {k: list(v) for k, v in (shapes or head.expected_tensors()).items()}
    )
    return d


def target_dir(root: Path, cfg: dict) -> Path:
    d = root / "target"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def tiny_env(tmp_path: Path, head: dict | None = None, shapes: dict | None = None, extra: str = "") -> Path:
    """A config on the tiny K2.6 EAGLE-3 path whose head and target are stand-ins in tmp_path."""
    h, t = head_dir(tmp_path, head or TINY_HEAD, shapes), target_dir(tmp_path, TINY_TARGET)
    return write_env(
        tmp_path / "c.env",
        f"INCLUDE={CONFIGS / 'cpu-kimi-tiny-eagle3.env'}\nPREPARE_MODELS=none\n"
        f"MODEL_DIR={t}\nDRAFT_MODEL_DIR={h}\n{extra}",
    )


# ---------------------------------------------------------------- the head on its own
def test_the_tiny_head_is_shaped_as_lightseekorgs_k26_head():
    head = Eagle3Head.from_config(TINY_HEAD)
    assert head.architecture == "Eagle3DeepseekV3ForCausalLM" and head.attention == "mla"
    assert head.model_type == "kimi_k2" and not head.wrapper_sees_mla()  # the trap, declared as the real head does
    assert head.num_hidden_layers == 1 and head.aux_ids == (1, 2, 3) and head.draft_vocab_size == 512
    head.check_target(TINY_TARGET, "tiny")
    t = head.expected_tensors()
    assert t["fc.weight"] == (256, 3 * 256) and t["d2t"] == (512,) and t["lm_head.weight"] == (512, 256)
    assert t["midlayer.self_attn.kv_a_proj_with_mqa.weight"] == (512 + 64, 2 * 256)  # embeds ++ fused states
    assert t["midlayer.self_attn.q_b_proj.weight"] == (2 * (128 + 64), 64)
    assert "midlayer.mlp.gate_proj.weight" in t and not any("experts" in k for k in t)  # a dense MLP
    assert "embed_tokens.weight" not in t  # the target's, shared


def test_the_production_head_stand_in_fits_kimi_k26():
    head = Eagle3Head.from_config(KIMI_HEAD)
    k26 = {
        "model_type": "kimi_k2",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "vocab_size": 163840,
        "kv_lora_rank": 512,
    }
    head.check_target(k26, "K2.6")
    assert head.aux_for(61) == default_aux_ids(61) == (2, 30, 58)


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"architectures": ["MistralForCausalLM"]}, "architectures", "Eagle3MistralForCausalLM"),
        ({"architectures": []}, "architectures", "one architecture"),
        ({"kv_lora_rank": None}, "kv_lora_rank", "MLA"),
        ({"draft_vocab_size": 2048}, "draft_vocab_size", "exceeds vocab_size 1024"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 1, 2]}}, AUX_IDS, "rise strictly"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 1, 2]}}, AUX_IDS, "rise strictly"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": "1,2"}}, AUX_IDS, "list of layer ids"),
        ({"num_aux_hidden_states": 2}, "num_aux_hidden_states", "names 3 layers"),
        ({"hidden_size": 0}, "hidden_size", "positive integer"),
        ({"eagle_config": [1, 2, 3]}, "eagle_config", "expected an object"),
    ],
)
def test_a_bad_head_config_is_refused_naming_its_field(change, field, words):
    with pytest.raises(Eagle3Error) as e:
        Eagle3Head.from_config({**TINY_HEAD, **change})
    assert e.value.field == field and str(e.value).startswith(f"{field}: ") and words in str(e.value)


@pytest.mark.parametrize(
    "head, target, field, words",
    [
        (TINY_HEAD, LLAMA_TARGET, "architectures", "needs a Llama-style head"),
        (LLAMA_HEAD, TINY_TARGET, "architectures", "needs an MLA head"),
        (
            {**TINY_HEAD, "hidden_size": 512, "target_hidden_size": 256},
            TINY_TARGET,
            "hidden_size",
            "has hidden_size 256",
        ),
        ({**TINY_HEAD, "target_hidden_size": 128}, TINY_TARGET, "target_hidden_size", "has hidden_size 256"),
        ({**TINY_HEAD, "vocab_size": 2048}, TINY_TARGET, "vocab_size", "has vocab_size 1024"),
        (
            {**TINY_HEAD, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 5]}},
            TINY_TARGET,
            AUX_IDS,
            "beyond 4",
        ),
        ({k: v for k, v in TINY_HEAD.items() if k != "eagle_config"}, TINY_TARGET, "eagle_config", "repeats a layer"),
    ],
)
def test_a_head_that_does_not_fit_its_target_is_refused_naming_its_field(head, target, field, words):
    with pytest.raises(Eagle3Error) as e:
        Eagle3Head.from_config(head).check_target(target, "the target")
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_the_last_layers_output_is_an_aux_id_only_where_the_backbone_captures_it():
    head = Eagle3Head.from_config({**TINY_HEAD, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 4]}})
    head.check_target(TINY_TARGET, "t", final_layer=True)
    with pytest.raises(Eagle3Error, match="does not capture"):
        head.check_target(TINY_TARGET, "t", final_layer=False)


def test_a_llama_style_head_fits_a_llama_target():
    head = Eagle3Head.from_config(LLAMA_HEAD)
    assert (head.architecture, head.attention) == ("LlamaForCausalLMEagle3", "standard") and head.wrapper_sees_mla()
    head.check_target(LLAMA_TARGET, "SmolLM2")
    t = head.expected_tensors()
    assert t["midlayer.self_attn.q_proj.weight"] == (9 * 64, 2 * 576) and t["midlayer.self_attn.k_proj.weight"] == (
        3 * 64,
        1152,
    )
    assert served_architecture("LlamaForCausalLM") == "Eagle3LlamaForCausalLM"


@pytest.mark.parametrize(
    "drop, reshape, words",
    [
        ("d2t", None, "no d2t tensor"),
        (None, ("d2t", [1024]), "d2t has shape [1024]"),
        (None, ("lm_head.weight", [1024, 256]), "has 1024 rows"),
        (None, ("fc.weight", [256, 512]), "fc.weight has shape [256, 512]"),
    ],
)
def test_tensors_that_contradict_the_config_are_refused(drop, reshape, words):
    head = Eagle3Head.from_config(TINY_HEAD)
    shapes = {k: list(v) for k, v in head.expected_tensors().items() if k != drop}
    if reshape:
        shapes[reshape[0]] = reshape[1]
    with pytest.raises(Eagle3Error, match=words.replace("[", r"\[").replace("]", r"\]")):
        head.check_tensors(shapes, 4)


# ---------------------------------------------------------------- the serve rules
def test_the_shipped_tiny_eagle3_config_validates_against_stand_ins(tmp_path):
    config = load_config(tiny_env(tmp_path), environ={})
    assert config.speculative_method == "eagle3" and config.speculative


@pytest.mark.parametrize(
    "change, shapes_change, words",
    [
        ({"hidden_size": 128, "target_hidden_size": 128}, None, "config.json: hidden_size: 128, but"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 7]}}, None, "eagle_aux_hidden_state_layer_ids"),
        (None, {"d2t": None}, "draft_vocab_size: 512 < vocab_size 1024"),
    ],
)
def test_serve_refuses_a_head_naming_the_draft_dir_and_the_field(tmp_path, change, shapes_change, words):
    cfg = {**TINY_HEAD, **(change or {})}
    shapes = {k: list(v) for k, v in Eagle3Head.from_config(cfg).expected_tensors().items()}
    for k, v in (shapes_change or {}).items():
        shapes.pop(k) if v is None else shapes.__setitem__(k, v)
    with pytest.raises(ConfigError) as e:
        load_config(tiny_env(tmp_path, cfg, shapes), environ={})
    assert e.value.key == "DRAFT_MODEL_DIR" and words in str(e.value), str(e.value)


def test_a_kimi_k2_head_is_served_only_where_patch_e1_covers_the_pin(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(tiny_env(tmp_path, extra="VLLM_VERSION=0.34.0\n"), environ={})
    assert e.value.key == "VLLM_VERSION" and "model_type kimi_k2" in str(e.value) and "E1" in str(e.value)
    # a head declaring a type vLLM's wrapper already counts as MLA needs no patch on that pin
    load_config(
        tiny_env(tmp_path / "v3", {**TINY_HEAD, "model_type": "deepseek_v3"}, extra="VLLM_VERSION=0.34.0\n"), environ={}
    )
    e1 = next(p for p in backends.load_patch_data()[0] if p["id"] == "E1")
    assert backends.covers(e1, "0.32.0") and backends.covers(e1, "0.33.0") and not backends.covers(e1, "0.34.0")


def test_a_draft_of_the_other_family_is_refused_naming_the_method(tmp_path):
    dflash = tmp_path / "dflash"
    dflash.mkdir()
    (dflash / "config.json").write_text((CONFIGS / "tiny-kimi-k2.6-dflash-draft.json").read_text())
    with pytest.raises(ConfigError, match="SPECULATIVE_METHOD.*DFlash drafter.*set SPECULATIVE_METHOD=dflash"):
        load_config(tiny_env(tmp_path, extra=f"DRAFT_MODEL_DIR={dflash}\n"), environ={})
    with pytest.raises(ConfigError, match="EAGLE-3 head.*set SPECULATIVE_METHOD=eagle3"):
        load_config(tiny_env(tmp_path, extra="SPECULATIVE_METHOD=dflash\nDRAFT_ATTENTION_BACKEND=\n"), environ={})


def test_eagle3_needs_a_draft_dir_and_a_pin_that_serves_it(tmp_path):
    with pytest.raises(ConfigError, match="DRAFT_MODEL_DIR.*eagle3 needs the draft checkpoint"):
        load_config(tiny_env(tmp_path, extra="DRAFT_MODEL_DIR=\n"), environ={})
    with pytest.raises(ConfigError, match="VLLM_VERSION.*from vLLM 0.32.0 on"):
        load_config(CONFIGS / "production-eagle3.env", {"VLLM_VERSION": "0.21.0"}, environ={})


# ---------------------------------------------------------------- rendering and the schedule
def spec_of(config) -> dict:
    argv = render(config).argv
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_the_production_heads_render_for_the_0_33_0_rocm_pin():
    bf16 = spec_of(load_config(CONFIGS / "production-eagle3.env", environ={}))
    assert bf16 == {
        "method": "eagle3",
        "model": "/models/kimi-k2.6-eagle3-mla",
        "num_speculative_tokens": 3,
        "attention_backend": "ROCM_AITER_MLA",  # what 0.33.0's ROCm order gives an MLA draft with AITER on
    }
    fp8 = load_config(CONFIGS / "production-eagle3-fp8kv.env", environ={})
    assert spec_of(fp8) == {**bf16, "kv_cache_dtype": "auto"}
    assert fp8.kv_cache_dtype == "fp8" and fp8.kv_scale_policy == "running-max"
    assert render(fp8).env["VLLM_ROCM_USE_AITER"] == "1"


def test_a_draft_schedule_renders_with_eagle3(tmp_path):
    config = load_config(tiny_env(tmp_path, extra="NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-2:3,3-8:0\n"), environ={})
    assert spec_of(config)["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 8, 0]]
    with pytest.raises(ConfigError, match="NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE.*1-2:4.*above"):
        load_config(tiny_env(tmp_path, extra="NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-2:4,3-8:0\n"), environ={})
    with pytest.raises(ConfigError, match="dflash or eagle3"):
        load_config(
            tiny_env(tmp_path, extra="SPECULATIVE_METHOD=ngram\nNUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-8:2\n"),
            environ={},
        )


def test_a_dflash_config_without_architectures_is_still_named_a_dflash_drafter(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"block_size": 8, "dflash_config": {"target_layer_ids": [0]}}))
    with pytest.raises(ConfigError, match=r"is a DFlash drafter \(dflash_config\); set SPECULATIVE_METHOD=dflash"):
        load_config(tiny_env(tmp_path, extra=f"DRAFT_MODEL_DIR={bare}\n"), environ={})


# ---------------------------------------------------------------- heads saved by speculators
SPECULATORS_HEAD = {  # the layout speculators 0.9.0 saves an EAGLE-3 head in (Eagle3SpeculatorConfig)
    "architectures": ["Eagle3Speculator"],
    "speculators_model_type": "eagle3",
    "draft_vocab_size": 16384,
    "norm_before_residual": True,
    "norm_before_fc": True,
    "target_hidden_size": None,
    "eagle_aux_hidden_state_layer_ids": [2, 15, 27],
    "speculators_config": {
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
        "verifier": {"name_or_path": "SmolLM2-135M-Instruct", "architectures": ["LlamaForCausalLM"]},
    },
    "transformer_layer_config": {
        k: v for k, v in LLAMA_HEAD.items() if k not in ("architectures", "eagle_config", "draft_vocab_size")
    },
}


def test_a_speculators_head_is_read_as_vllms_speculators_loader_reads_it():
    head = Eagle3Head.from_config(SPECULATORS_HEAD)
    assert (head.architecture, head.attention, head.draft_vocab_size) == ("Eagle3LlamaForCausalLM", "standard", 16384)
    assert head.aux_ids == (2, 15, 27) and head.target_hidden_size == 576 and head.raw["norm_before_residual"] is True
    head.check_target(LLAMA_TARGET, "SmolLM2")
    with pytest.raises(Eagle3Error, match="architectures: .*standard-attention head but .* needs an MLA head"):
        head.check_target(TINY_TARGET, "the tiny K2.6")
    qwen = {
        **SPECULATORS_HEAD,
        "transformer_layer_config": {**SPECULATORS_HEAD["transformer_layer_config"], "model_type": "qwen3"},
    }
    assert Eagle3Head.from_config(qwen).architecture == "Eagle3Qwen3ForCausalLM"


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"speculators_model_type": "dflash"}, "speculators_model_type", "another algorithm"),
        ({"transformer_layer_config": None}, "transformer_layer_config", "expected the head's decoder config"),
        (
            {"transformer_layer_config": {"model_type": "deepseek_v3", "hidden_size": 256}},
            "transformer_layer_config.model_type",
            "llama or qwen3 layers only",
        ),
        ({"eagle_aux_hidden_state_layer_ids": [15, 2, 27]}, AUX_IDS, "must rise strictly"),
    ],
)
def test_a_bad_speculators_head_is_refused_naming_its_field(change, field, words):
    with pytest.raises(Eagle3Error) as e:
        Eagle3Head.from_config({**SPECULATORS_HEAD, **change})
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_serve_takes_a_speculators_head_under_eagle3_and_refuses_it_under_dflash(tmp_path):
    """SmolLM2's config with a speculators-format Llama head and a stand-in target: validated as
    vLLM would load it; under dflash refused naming the method its checkpoint says."""
    from kimidflash.config.drafts import draft_method

    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps(SPECULATORS_HEAD))
    shapes = {
        k.replace("midlayer.", "layers.0."): list(v)
        for k, v in Eagle3Head.from_config(SPECULATORS_HEAD).expected_tensors().items()
    }
    write_safetensors_header(head / "model.safetensors", {**shapes, "t2d": [49152]})
    target = target_dir(tmp_path, LLAMA_TARGET)
    env = write_env(
        tmp_path / "c.env",
        f"INCLUDE={CONFIGS / 'cpu-reference.env'}\nPREPARE_MODELS=none\n"
        f"MODEL_DIR={target}\nDRAFT_MODEL_DIR={head}\nSPECULATIVE_METHOD=eagle3\n"
        "NUM_SPECULATIVE_TOKENS=3\nDRAFT_CONFIG=\n",
    )
    assert load_config(env, environ={}).speculative_method == "eagle3"
    with pytest.raises(
        ConfigError, match=r"SPECULATIVE_METHOD .*dflash, but .* is an EAGLE-3 head .*set SPECULATIVE_METHOD=eagle3"
    ):
        load_config(env, {"SPECULATIVE_METHOD": "dflash"}, environ={})
    assert draft_method({"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"]}) == "dflash"
