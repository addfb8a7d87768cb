"""The tiny Kimi K2.6 generator's layout, checked without generating it (no torch needed):
what it writes must be K2.6's checkpoint layout, since that is what it stands in for."""

from __future__ import annotations

from kimidflash.config import load_config
from kimidflash.cpu_reference import generated, tiny, tiny_kimi
from kimidflash.paths import CONFIGS_DIR


def test_text_weights_sit_under_language_model_with_an_untied_head_and_k26s_mla_dims():
    names = dict(tiny_kimi.text_tensors())
    assert all(n.startswith("language_model.") for n in names)
    assert names["language_model.lm_head.weight"] == names["language_model.model.embed_tokens.weight"] == (1024, 256)
    assert "language_model.model.norm.weight" in names
    t = tiny_kimi.TEXT
    assert (t["kv_lora_rank"], t["qk_rope_head_dim"], t["qk_nope_head_dim"], t["v_head_dim"]) == (512, 64, 128, 128)
    assert names["language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight"] == (512 + 64, 256)
    assert names["language_model.model.layers.1.self_attn.kv_b_proj.weight"] == (2 * (128 + 128), 512)
    assert t["tie_word_embeddings"] is False and t["rope_scaling"]["type"] == "yarn"


def test_moe_is_routed_as_k26_routes_it_with_a_dense_first_layer_and_per_expert_names():
    names = dict(tiny_kimi.text_tensors())
    t = tiny_kimi.TEXT
    assert (t["topk_method"], t["scoring_func"], t["n_shared_experts"]) == ("noaux_tc", "sigmoid", 1)
    assert "language_model.model.layers.0.mlp.gate_proj.weight" in names  # first_k_dense_replace=1
    for L in range(1, t["num_hidden_layers"]):
        p = f"language_model.model.layers.{L}.mlp."
        assert names[p + "gate.e_score_correction_bias"] == (t["n_routed_experts"],)
        assert {f"{p}experts.{e}.down_proj.weight" for e in range(t["n_routed_experts"])} <= names.keys()
        assert names[p + "shared_experts.up_proj.weight"] == (t["moe_intermediate_size"], t["hidden_size"])


def test_vision_tower_uses_the_checkpoints_names_that_vllm_maps():
    names = dict(tiny_kimi.vision_tensors())
    assert "vision_tower.encoder.blocks.0.wqkv.weight" in names and "mm_projector.proj.2.weight" in names
    assert names["mm_projector.proj.2.weight"][0] == tiny_kimi.TEXT["hidden_size"]
    assert not any(n.startswith("model.") for n in names)


def test_kimi_tokens_are_single_special_tokens_and_the_drafter_json_matches_the_target():
    for token in (
        "<think>",
        "</think>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<|media_pad|>",
    ):
        assert token in tiny_kimi.SPECIAL_TOKENS
    shape = tiny_kimi.drafter_shape()
    assert shape.mask_token_id == tiny_kimi.TOKEN_ID["<|reserved_mask|>"]
    assert shape.num_target_layers == tiny_kimi.TEXT["num_hidden_layers"]
    assert shape.raw["rope_scaling"]["type"] == "yarn" and shape.rope_theta == tiny_kimi.TEXT["rope_theta"]


def test_the_chat_template_writes_k26s_turns_tool_declarations_and_calls():
    import jinja2

    template = jinja2.Environment().from_string(tiny_kimi.CHAT_TEMPLATE)
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "functions.f:0", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "functions.f:0", "content": "42"},
    ]
    text = template.render(
        messages=messages,
        tools=[{"type": "function", "function": {"name": "f"}}],
        add_generation_prompt=True,
        thinking=False,
    )
    assert text.startswith("<|im_system|>tool_declare<|im_middle|>[")
    assert "<|im_user|>user<|im_middle|>hi<|im_end|>" in text
    assert (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
        '{"a": 1}<|tool_call_end|><|tool_calls_section_end|>'
    ) in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.f:0\n42<|im_end|>" in text
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    thinking = template.render(messages=messages[:1], add_generation_prompt=True)
    assert thinking.endswith("<|im_assistant|>assistant<|im_middle|>")


def test_prepare_values_name_their_generators_and_the_config_serves_the_kimi_pair():
    assert generated.KINDS[generated.PREPARE_KIND["tiny"]] is tiny
    assert generated.KINDS[generated.PREPARE_KIND["tiny-kimi"]] is tiny_kimi
    values = load_config(CONFIGS_DIR / "cpu-kimi-tiny.env", {}, environ={})
    assert values.prepare_models == "tiny-kimi" and values.target_attention == "mla"
    assert (values.tool_call_parser, values.reasoning_parser, values.trust_remote_code) == (
        "kimi_k2",
        "kimi_k2",
        True,
    )
    assert values.block_size == 16 and values.dtype == "float32"


def test_config_json_is_k26s_file_form_and_transformers_reads_it_as_kimi_k25(tmp_path):
    import json

    from transformers import AutoConfig

    data = tiny_kimi.config_json()
    assert data["text_config"]["model_type"] == "kimi_k2" and "rope_scaling" in data["text_config"]
    assert data["media_placeholder_token_id"] == data["image_token_id"] == tiny_kimi.TOKEN_ID["<|media_pad|>"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert cfg.model_type == "kimi_k25" and cfg.text_config.vocab_size == tiny_kimi.VOCAB_SIZE
    assert cfg.text_config.rope_parameters["rope_type"] == "yarn"
    assert cfg.text_config.rope_parameters["factor"] == 64.0


def test_a_drafter_the_generator_did_not_write_is_never_generated_over(tmp_path):
    """DRAFT_MODEL_DIR may name a trained drafter (an A/B's variant, say) while PREPARE_MODELS
    generates the pair: the target is made, the trained drafter is left byte for byte."""
    target, trained = tmp_path / "target", tmp_path / "trained"
    trained.mkdir()
    (trained / "model.safetensors").write_bytes(b"trained weights")
    assert tiny.foreign(trained) and not tiny.foreign(tmp_path / "absent")
    assert not generated.pair_is_current("tiny-kimi", target, trained)  # the target is still to make
    tiny_kimi.generate(target, trained)
    assert tiny_kimi.is_current(target) and (trained / "model.safetensors").read_bytes() == b"trained weights"
    assert generated.pair_is_current("tiny-kimi", target, trained)
    tiny_kimi.generate(target, tmp_path / "random")  # an absent drafter is generated as before
    assert tiny_kimi.is_current(tmp_path / "random")


def test_a_cpu_pin_without_patch_c1_is_refused_for_dflash_on_an_mla_target():
    import pytest

    from kimidflash.config import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS_DIR / "cpu-kimi-tiny.env", {"VLLM_VERSION": "0.31.0"}, environ={})
    assert info.value.key == "VLLM_VERSION" and "patch C1" in str(info.value) and "0.32.0" in str(info.value)
    # ngram needs no shared block size with a draft model: the same pin is fine there.
    load_config(
        CONFIGS_DIR / "cpu-kimi-tiny.env", {"VLLM_VERSION": "0.31.0", "SPECULATIVE_METHOD": "ngram"}, environ={}
    )
