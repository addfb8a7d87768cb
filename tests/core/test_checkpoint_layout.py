"""One reader of the target's config and tensor names, for every layout the recipe meets (fast tier).

Kimi K2.6 (`KimiK25ForConditionalGeneration`) nests its text config under
`text_config` and its weights under `language_model.`, beside a vision tower;
DeepseekV3 and Llama/Qwen3 are flat. Real safetensors files, written in
tmp_path, single-file and sharded with an index.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from kimidflash import checkpoint_layout as layout
from kimidflash.config.rules import model_field
from kimidflash.errors import RecipeError, TrainConfigError
from kimidflash.formats.drafter import DrafterShape
from kimidflash.fp8 import checkpoint as fp8ck
from kimidflash.train import config as tcfg
from kimidflash.train.target import remote_code, target_info
from kimidflash.train.target_weights import load_target_head
from kimidflash.train.trainer import build_model
from kimidflash.train.warmstart import COPIED, target_layer_tensors

from ..train.test_train_model import SHAPE

V, H = SHAPE["vocab_size"], SHAPE["hidden_size"]
TEXT = {
    "model_type": "deepseek_v3",
    "vocab_size": V,
    "hidden_size": H,
    "num_hidden_layers": 4,
    "kv_lora_rank": 512,
    "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
}
K26_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": TEXT,
    "vision_config": {"hidden_size": 64},
    "media_placeholder_token_id": 7,
    "quantization_config": {"quant_method": "compressed-tensors"},
}


def g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def layer_tensors(prefix: str, layers: int, seed: int = 3) -> dict[str, torch.Tensor]:
    """Llama-shaped decoder layers with the drafter's geometry (what init_from_target copies)."""
    want = DrafterShape.coerce(SHAPE).expected_tensors()
    gen = g(seed)
    return {
        f"{prefix}layers.{L}.{n}": torch.randn(want[f"layers.0.{n}"], generator=gen)
        for L in range(layers)
        for n in COPIED
    }


def write_checkpoint(root: Path, tensors: dict[str, torch.Tensor], config: dict | None, shards: int = 1) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(root / "model.safetensors"))
        return root
    wm = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(root / fname))
        wm.update({n: fname for n in part})
    (root / layout.INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return root


def k26_tensors() -> dict[str, torch.Tensor]:
    """Kimi K2.6's names: the text model under language_model., a vision tower and projector beside it."""
    t = {
        "language_model.model.embed_tokens.weight": torch.randn(V, H, generator=g(1)),
        "language_model.lm_head.weight": torch.randn(V, H, generator=g(2)),
        "language_model.model.norm.weight": torch.ones(H),
        "vision_tower.encoder.blocks.0.wqkv.weight": torch.randn(12, 4, generator=g(4)),
        "vision_tower.encoder.blocks.0.wo.weight": torch.randn(4, 4, generator=g(5)),
        "mm_projector.proj.0.weight": torch.randn(H, 4, generator=g(6)),
    }
    return t | layer_tensors("language_model.model.", 3)


# ------------------------------------------------------------------ config fields
@pytest.mark.parametrize("cfg", [K26_CONFIG, TEXT], ids=["k2.6-nested", "deepseek-flat"])
def test_the_text_models_fields_are_read_nested_or_flat(cfg):
    assert layout.text_config(cfg) is TEXT
    assert [layout.text_field(cfg, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers")] == [V, H, 4]
    assert layout.text_field(cfg, "rope_scaling")["factor"] == 64.0
    assert layout.is_mla(cfg) and layout.tie_word_embeddings(cfg) is False


def test_wrapper_fields_come_from_the_top_level_first_as_vllm_reads_them():
    assert model_field(K26_CONFIG, "quantization_config") == {"quant_method": "compressed-tensors"}  # rules' reader
    assert layout.model_field(K26_CONFIG, "num_hidden_layers") == 4  # else the text config's
    # a top-level false beats a text_config that kept a class default of true
    wrapped = {"tie_word_embeddings": False, "text_config": {"tie_word_embeddings": True, "num_hidden_layers": 2}}
    assert layout.tie_word_embeddings(wrapped) is False
    assert layout.tie_word_embeddings({"text_config": {"num_hidden_layers": 2}}) is None
    llama = {"model_type": "llama", "num_hidden_layers": 2, "tie_word_embeddings": True}
    assert not layout.is_mla(llama) and layout.tie_word_embeddings(llama) is True
    assert layout.is_mla({"model_type": "deepseek_v3"})  # kv_lora_rank defaults to 512 in its config class
    assert not layout.is_mla({"model_type": "deepseek_v3", "kv_lora_rank": None})


def test_fp8_and_rules_use_the_same_reader():
    from kimidflash.fp8 import calibrate

    assert calibrate.text_config is layout.text_config and calibrate.is_mla is layout.is_mla
    assert not hasattr(fp8ck, "text_config") and not hasattr(fp8ck, "is_mla")  # no second copy to drift
    assert fp8ck.num_layers(K26_CONFIG, "c") == fp8ck.num_layers(TEXT, "c") == 4


# ------------------------------------------------------------------ tensor names
@pytest.mark.parametrize("case", ["llama-tied", "llama-untied", "deepseek-mtp", "k2.6", "transformers5"])
def test_embedding_head_norm_and_layers_are_found_by_suffix(case):
    names = {
        "llama-tied": ["model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight"],
        "llama-untied": ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"],
        # DeepSeek V3's MTP layer carries an embedding of its own: not the text model's
        "deepseek-mtp": [
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.norm.weight",
            "model.layers.61.embed_tokens.weight",
            "model.layers.61.shared_head.head.weight",
        ],
        "k2.6": list(k26_tensors()),
        "transformers5": [
            "model.language_model.embed_tokens.weight",
            "lm_head.weight",
            "model.language_model.norm.weight",
            "model.visual.blocks.0.attn.qkv.weight",
        ],
    }[case]
    config = {"llama-tied": {"tie_word_embeddings": True}, "k2.6": K26_CONFIG}.get(case)
    lay = layout.find_layout(names, config, case)
    prefix = {"k2.6": "language_model.model.", "transformers5": "model.language_model."}.get(case, "model.")
    head = {"llama-tied": prefix + "embed_tokens.weight", "k2.6": "language_model.lm_head.weight"}.get(
        case, "lm_head.weight"
    )
    assert (lay.prefix, lay.embed, lay.head, lay.norm) == (
        prefix,
        prefix + "embed_tokens.weight",
        head,
        prefix + "norm.weight",
    )
    assert lay.tied == (case == "llama-tied") and lay.layer(5) == f"{prefix}layers.5."


def test_a_tied_config_uses_the_embedding_even_beside_a_head_tensor_as_vllm_does():
    names = ["model.embed_tokens.weight", "lm_head.weight"]
    assert layout.find_layout(names, {"tie_word_embeddings": True}, "t").head == "model.embed_tokens.weight"
    assert layout.find_layout(names, {}, "t").head == "lm_head.weight"  # not said: the head that is there
    assert layout.find_layout(names[:1], None, "t").tied  # no head, nothing said: transformers ties by default


def test_an_untied_target_without_its_head_is_refused_naming_the_names_searched_for(tmp_path):
    t = {k: v for k, v in k26_tensors().items() if k != "language_model.lm_head.weight"}
    d = write_checkpoint(tmp_path / "k", t, K26_CONFIG)
    with pytest.raises(TrainConfigError) as e:
        load_target_head(d)
    msg = str(e.value)
    assert "\n" not in msg and str(d) in msg and "tie_word_embeddings false" in msg
    for name in ("lm_head.weight", "language_model.lm_head.weight", "language_model.model.lm_head.weight"):
        assert name in msg
    assert isinstance(e.value, RecipeError)


def test_a_target_without_an_embedding_is_refused_in_one_line(tmp_path):
    d = write_checkpoint(tmp_path / "k", {"lm_head.weight": torch.ones(2, 2), "x.weight": torch.ones(1)}, None)
    with pytest.raises(TrainConfigError) as e:
        load_target_head(d)
    msg = str(e.value)
    assert "\n" not in msg and "no token embedding among 2 tensors" in msg
    assert "model.embed_tokens.weight" in msg and "language_model.model.embed_tokens.weight" in msg
    with pytest.raises(layout.LayoutError, match="more than one token embedding"):
        layout.find_layout(["a.embed_tokens.weight", "b.embed_tokens.weight"], None, "two")


@pytest.mark.parametrize("shards", [1, 3])
def test_training_uses_k26s_own_lm_head_not_its_embedding(tmp_path, shards):
    """The fault: `lm_head.weight` was looked for by exact name, so K2.6's
    `language_model.lm_head.weight` was missed and the embedding silently became the head."""
    t = k26_tensors()
    d = write_checkpoint(tmp_path / "k26", t, K26_CONFIG, shards)
    embed, head = load_target_head(d)
    assert torch.equal(embed, t["language_model.model.embed_tokens.weight"])
    assert torch.equal(head, t["language_model.lm_head.weight"]) and not torch.equal(head, embed)
    model = build_model(SHAPE, embed, head, seed=0, std=0.05)  # what train() builds
    h = torch.randn(3, H, generator=g(9))
    assert torch.allclose(model.logits(h), h @ t["language_model.lm_head.weight"].T, atol=1e-5)


def test_a_tied_llama_trains_against_its_embedding(tmp_path):
    emb = torch.randn(V, H, generator=g(1))
    d = write_checkpoint(tmp_path / "l", {"model.embed_tokens.weight": emb}, {"tie_word_embeddings": True})
    embed, head = load_target_head(d)
    assert torch.equal(embed, emb) and torch.equal(head, emb)


def test_the_warm_start_finds_k26s_layers_under_language_model(tmp_path):
    t = k26_tensors()
    d = write_checkpoint(tmp_path / "k26", t, K26_CONFIG, shards=2)
    init = target_layer_tensors(d, [2, 0], DrafterShape.coerce(SHAPE))
    for n in COPIED:
        assert torch.equal(init[f"layers.0.{n}"], t[f"language_model.model.layers.2.{n}"])
        assert torch.equal(init[f"layers.1.{n}"], t[f"language_model.model.layers.0.{n}"])
    with pytest.raises(TrainConfigError, match=r"has no language_model\.model\.layers\.7\."):
        target_layer_tensors(d, [7, 0], DrafterShape.coerce(SHAPE))


def test_the_fp8_overlay_reads_the_same_layer_prefix(tmp_path):
    names = list(k26_tensors()) + ["vision_tower.encoder.layers.0.self_attn.q_proj.weight"]
    # a vision tower with its own layers.0.self_attn.* no longer makes the prefix ambiguous
    assert fp8ck.layer_prefix(names, "k") == "language_model.model."
    assert fp8ck.layer_prefix(["model.layers.0.self_attn.k_scale"], "scales only") == "model."
    d = write_checkpoint(tmp_path / "k26", k26_tensors(), K26_CONFIG, shards=2)
    assert fp8ck.weight_map(d) == layout.weight_map(d) and len(fp8ck.weight_map(d)) == len(k26_tensors())


# ------------------------------------------------------------------ tokenizer
def _train_cfg(tmp_path: Path, target: dict) -> tcfg.TrainConfig:
    from ..support.helpers import CONFIGS

    p = tmp_path / "train.json"
    p.write_text(json.dumps({"drafter_config": str(CONFIGS / "smollm2-dflash-draft.json"), "target": target}))
    return tcfg.load(p)


def test_remote_code_is_trusted_as_the_serve_config_or_the_checkpoint_says(tmp_path):
    from ..support.helpers import write_env

    d = tmp_path / "kimi"
    d.mkdir()
    auto = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto}))
    assert layout.declares_remote_code(d)
    assert target_info(_train_cfg(tmp_path, {"model_dir": str(d)})).trust_remote_code is True
    plain = tmp_path / "llama"
    plain.mkdir()
    (plain / "tokenizer_config.json").write_text("{}")
    assert target_info(_train_cfg(tmp_path, {"model_dir": str(plain)})).trust_remote_code is False
    env = write_env(tmp_path / "s.env", f"MODEL_DIR={d}\nTRUST_REMOTE_CODE=false\n")
    served = _train_cfg(tmp_path, {"serve_config": str(env)})
    assert target_info(served).trust_remote_code is False  # vLLM would load it without: so do we
    # capture's HF source asks about the folder it loads: the run's target as above, another by its auto_map
    assert remote_code(served, str(d)) is False and remote_code(served, str(plain)) is False
    assert remote_code(_train_cfg(tmp_path, {"model_dir": str(plain)}), str(d)) is True


def test_setup_reads_k26s_nested_config_and_loads_the_tokenizer_with_remote_code(tmp_path, monkeypatch):
    from kimidflash.train import phases

    from ..support.helpers import CONFIGS

    target = tmp_path / "k26"
    shape = json.loads((CONFIGS / "smollm2-dflash-draft.json").read_text())
    text = dict(TEXT, vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"], num_hidden_layers=30)
    target.mkdir()
    (target / "config.json").write_text(json.dumps(dict(K26_CONFIG, text_config=text, auto_map={"AutoConfig": "x.C"})))
    seen = []

    class Tok:
        def convert_ids_to_tokens(self, i):
            return f"<{i}>"

    monkeypatch.setattr(phases, "load_tokenizer", lambda info: seen.append(info) or Tok())
    cfg = _train_cfg(tmp_path, {"model_dir": str(target)})
    phases.phase_setup(cfg, tmp_path / "run", phases.PhaseArgs(), log=lambda _: None)
    assert [i.trust_remote_code for i in seen] == [True]
    (target / "config.json").write_text(json.dumps(dict(K26_CONFIG, text_config=dict(text, hidden_size=7168))))
    with pytest.raises(TrainConfigError, match=r"differ from the target's 49152/7168"):
        phases.phase_setup(cfg, tmp_path / "run", phases.PhaseArgs(), log=lambda _: None)
