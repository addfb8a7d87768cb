"""The speculators engine's command lines and the drafter formats between speculators and us.

Fast: the argv builders (commands.py) for our SmolLM2 drafter shape, and the
speculators -> recipe mapping (export.py) on small speculators-format
checkpoints written here with the names a real `speculators train --dry-run`
saves (config.json with transformer_layer_config / aux_hidden_state_layer_ids,
body tensors under our names, the target's embed_tokens / lm_head /
verifier_norm alongside).

Slow: the real `speculators train --dry-run` (managed venv) on the tiny Kimi
K2.6 pair, exported to our format and checked against the drafter shape, and
the shipped tiny drafter warm-started through `speculators convert` and back,
bit for bit (about 35 s on 2 cores).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kimidflash.errors import TrainConfigError
from kimidflash.formats.drafter import DrafterShape
from kimidflash.train.config import TrainOptions
from kimidflash.train.speculators import commands
from kimidflash.train.speculators.export import SpeculatorsCheckpointError, checkpoint_dir, to_recipe_drafter

from ..support.helpers import CONFIGS, ROOT

SHAPE = DrafterShape.from_dict(
    {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "intermediate_size": 16,
        "hidden_act": "silu",
        "vocab_size": 32,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": 4,
        "num_target_layers": 5,
        "dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 2]},
    },
    "test shape",
)


def spec_config(shape: DrafterShape = SHAPE, **top) -> dict:
    """config.json as speculators 0.9.0 saves a DFlash drafter (keys as a real dry run writes them)."""
    tlc = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": shape.rms_norm_eps,
        "attention_bias": False,
        "max_position_embeddings": 64,
        "layer_types": ["full_attention"] * shape.num_hidden_layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": False,
    }
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"": "config.DFlashSpeculatorConfig"},
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "transformers_version": "5.19.0",
        "aux_hidden_state_layer_ids": [i + 1 for i in shape.target_layer_ids],
        "block_size": 8,
        "draft_vocab_size": shape.vocab_size,
        "mask_token_id": shape.mask_token_id,
        "sample_from_anchor": False,
        "sliding_window_non_causal": False,
        "target_hidden_size": None,
        "dtype": "bfloat16",
        "speculators_config": {"algorithm": "dflash", "verifier": {"name_or_path": "/models/target"}},
        "transformer_layer_config": tlc,
    }
    for key, value in top.items():
        if key.startswith("tlc_"):
            tlc[key[4:]] = value
        else:
            cfg[key] = value
    return cfg


def body(shape: DrafterShape = SHAPE, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shape.expected_tensors().items()}


def write_ckpt(path, cfg=None, tensors=None, target_owned=True):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg or spec_config(), indent=2))
    tensors = dict(body() if tensors is None else tensors)
    if target_owned:  # what a checkpoint may carry of the target's own weights
        H, V = SHAPE.hidden_size, SHAPE.vocab_size
        tensors.update(
            {
                "embed_tokens.weight": torch.zeros(V, H, dtype=torch.bfloat16),
                "lm_head.weight": torch.zeros(V, H, dtype=torch.bfloat16),
                "verifier_norm.weight": torch.ones(H, dtype=torch.bfloat16),
            }
        )
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "train_command.txt").write_text("# speculators: 0.9.0\n/venv/bin/speculators --speculator-type dflash\n")
    return path


# --- commands.py ------------------------------------------------------------------------------------


def test_fresh_drafter_dry_run_argv_for_smollm2_is_the_one_that_ran():
    shape = DrafterShape.load(CONFIGS / "smollm2-dflash-draft.json")
    opts = commands.SpecTrainOptions(block_size=8, seed=0)
    args = commands.train_args(
        shape,
        "/m/smollm2",
        "/d/data",
        "/d/hs",
        "/d/dry",
        opts,
        draft_config_path="/d/draft.json",
        dry_run=True,
        log_dir="/d/logs",
    )
    assert args[:16] == [
        "--speculator-type",
        "dflash",
        "--verifier-name-or-path",
        "/m/smollm2",
        "--draft-config",
        "/d/draft.json",
        "--target-layer-ids",
        "2",
        "9",
        "16",
        "23",
        "29",
        "--mask-token-id",
        "16",
        "--block-size",
        "8",
    ]
    flags = dict(zip(args[16::2], args[17::2], strict=False))
    assert {
        k: flags[k]
        for k in (
            "--loss-fn",
            "--per-position-loss-weight",
            "--dflash-decay-gamma",
            "--on-missing",
            "--hidden-states-path",
            "--data-path",
            "--save-path",
            "--optimizer",
        )
    } == {
        "--loss-fn": "ce",
        "--per-position-loss-weight": "fixed-exp-decay",
        "--dflash-decay-gamma": "4.0",
        "--on-missing": "raise",
        "--hidden-states-path": "/d/hs",
        "--data-path": "/d/data",
        "--save-path": "/d/dry",
        "--optimizer": "adamw",
    }
    assert args[-1] == "--dry-run" and "--no-resume-from-checkpoint" not in args and "--fsdp-shard" not in args


def test_warm_start_argv_leaves_the_shape_to_the_checkpoint():
    """speculators ignores --block-size/--mask-token-id/--target-layer-ids with --from-pretrained; never pass them."""
    opts = commands.SpecTrainOptions(max_steps=10, fsdp_shard=True)
    args = commands.train_args(SHAPE, "/t", "/d", "/h", "/s", opts, from_pretrained="/warm", resume=False)
    assert args[args.index("--from-pretrained") + 1] == "/warm"
    assert not {"--draft-config", "--block-size", "--mask-token-id", "--target-layer-ids", "--dry-run"} & set(args)
    assert {"--fsdp-shard", "--no-resume-from-checkpoint"} <= set(args)
    assert args[args.index("--max-steps") + 1] == "10"
    with pytest.raises(ValueError, match="exactly one"):
        commands.train_args(SHAPE, "/t", "/d", "/h", "/s", opts)
    with pytest.raises(ValueError, match="exactly one"):
        commands.train_args(SHAPE, "/t", "/d", "/h", "/s", opts, from_pretrained="/w", draft_config_path="/c")


def test_our_train_options_map_onto_speculators_names():
    tc = TrainOptions(
        steps=300,
        batch_size=4,
        anchors_per_seq=24,
        block_size=16,
        gamma=7.0,
        lr=2e-3,
        weight_decay=0.01,
        warmup_steps=20,
    )
    o = commands.options_from(tc, seed=3, max_length=1024, epochs=2)
    assert (
        o.max_steps,
        o.max_anchors,
        o.total_seq_len,
        o.block_size,
        o.gamma,
        o.lr,
        o.seed,
        o.epochs,
        o.weight_decay,
        o.warmup_steps,
    ) == (300, 96, 4096, 16, 7.0, 2e-3, 3, 2, 0.01, 20)


def test_draft_config_is_the_shape_as_a_full_attention_qwen3_decoder(tmp_path):
    shape = DrafterShape.load(CONFIGS / "kimi-k2.6-dflash-draft.json")
    cfg = json.loads(commands.write_draft_config(shape, tmp_path / "d.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["use_sliding_window"] is False and cfg["tie_word_embeddings"] is False
    assert (
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
    ) == (6, 64, 8, 128, 18432, 163840)
    assert cfg["rope_parameters"] == shape.rope.parameters() and cfg["rope_parameters"]["rope_type"] == "yarn"
    assert not {"dflash_config", "block_size", "training", "layer_types"} & set(cfg)


def test_convert_argv_names_the_aux_ids_for_multimodal_targets():
    args = commands.convert_args("/ours", "/kimi", "/out", SHAPE)
    assert args[:8] == ["convert", "/ours", "--algorithm", "dflash", "--verifier", "/kimi", "--output-path", "/out"]
    assert json.loads(args[args.index("--algorithm-kwargs") + 1]) == {"aux_hidden_state_layer_ids": [1, 3]}
    assert commands.target_layer_ids(commands.aux_layer_ids(SHAPE)) == list(SHAPE.target_layer_ids)


# --- export.py: speculators -> recipe -----------------------------------------------------------------


def test_a_speculators_checkpoint_becomes_our_drafter(tmp_path):
    tensors = body()
    ckpt = write_ckpt(tmp_path / "dry", tensors=tensors)
    out = to_recipe_drafter(ckpt, SHAPE, tmp_path / "drafter", "bfloat16", {"run": "r1"})
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text()) == json.loads(json.dumps(SHAPE.vllm_config("bfloat16")))
    got = load_file(out / "model.safetensors")
    assert {k: tuple(v.shape) for k, v in got.items()} == SHAPE.expected_tensors()
    assert all(torch.equal(got[k], tensors[k]) for k in got)
    manifest = json.loads((out / "manifest.json").read_text())
    rec = manifest["speculators_export"]
    assert manifest["run"] == "r1"
    assert (rec["aux_hidden_state_layer_ids"], rec["target_layer_ids"]) == ([1, 3], [0, 2])
    assert (rec["trained_block_size"], rec["served_block_size"]) == (8, 4)
    assert sorted(rec["left_out"]) == ["embed_tokens.weight", "lm_head.weight", "verifier_norm.weight"]
    assert rec["train_command"] == ["/venv/bin/speculators --speculator-type dflash"]
    assert list(rec["files"]) == ["model.safetensors"] and len(rec["files"]["model.safetensors"]) == 64


def test_a_training_save_path_exports_its_last_epoch(tmp_path):
    run = tmp_path / "run"
    write_ckpt(run / "0", tensors=body(seed=0))
    write_ckpt(run / "2", tensors=body(seed=2))
    (run / "epoch2_end").symlink_to("2")
    assert checkpoint_dir(run) == run / "2"
    out = to_recipe_drafter(run, SHAPE, tmp_path / "d", "float32", {})
    assert torch.equal(load_file(out / "model.safetensors")["fc.weight"], body(seed=2)["fc.weight"].float())
    with pytest.raises(SpeculatorsCheckpointError, match="no speculators checkpoint"):
        checkpoint_dir(tmp_path / "empty")


def test_a_tensor_of_the_wrong_shape_is_refused_naming_checkpoint_and_tensor(tmp_path):
    tensors = body()
    tensors["layers.1.mlp.up_proj.weight"] = torch.zeros(12, 8, dtype=torch.bfloat16)
    ckpt = write_ckpt(tmp_path / "ckpt", tensors=tensors)
    out = tmp_path / "drafter"
    with pytest.raises(SpeculatorsCheckpointError) as e:
        to_recipe_drafter(ckpt, SHAPE, out, "bfloat16", {})
    assert str(ckpt) in str(e.value) and "layers.1.mlp.up_proj.weight" in str(e.value) and "[16, 8]" in str(e.value)
    assert not out.exists()


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda t: t.pop("layers.0.self_attn.k_norm.weight"), "layers.0.self_attn.k_norm.weight is missing"),
        (lambda t: t.update({"layers.2.mlp.up_proj.weight": torch.zeros(16, 8)}), "layers.2.mlp.up_proj.weight"),
        (lambda t: t.update({"t2d": torch.ones(32, dtype=torch.bool)}), "t2d maps a reduced draft vocabulary"),
        (lambda t: t.update({"fc.weight": t["fc.weight"].clone().fill_(float("nan"))}), "fc.weight holds NaN"),
    ],
)
def test_a_checkpoint_whose_tensors_do_not_fit_is_refused(tmp_path, change, words):
    tensors = body()
    change(tensors)
    with pytest.raises(SpeculatorsCheckpointError, match=words):
        to_recipe_drafter(write_ckpt(tmp_path / "c", tensors=tensors), SHAPE, tmp_path / "d", "bfloat16", {})


def test_a_reduced_vocabulary_head_is_refused(tmp_path):
    tensors = {**body(), "lm_head.weight": torch.zeros(16, 8)}
    with pytest.raises(SpeculatorsCheckpointError, match="lm_head.weight has shape \\[16, 8\\]"):
        to_recipe_drafter(
            write_ckpt(tmp_path / "c", tensors=tensors, target_owned=False), SHAPE, tmp_path / "d", "bfloat16", {}
        )


@pytest.mark.parametrize(
    "change, words",
    [
        ({"aux_hidden_state_layer_ids": [0, 2]}, "aux_hidden_state_layer_ids is \\[0, 2\\]"),
        ({"mask_token_id": 7}, "mask_token_id is 7"),
        ({"speculators_model_type": "dflash2"}, "speculators_model_type"),
        ({"sample_from_anchor": True}, "sample_from_anchor"),
        ({"draft_vocab_size": 16}, "reduced draft vocabulary"),
        ({"tlc_num_hidden_layers": 3}, "transformer_layer_config.num_hidden_layers is 3"),
        ({"tlc_intermediate_size": 32}, "transformer_layer_config.intermediate_size is 32"),
        (
            {"tlc_layer_types": ["sliding_attention", "full_attention"], "tlc_sliding_window": 2048},
            "draft layers \\[0\\] were trained with sliding-window",
        ),
        ({"tlc_rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}, "rope"),
    ],
)
def test_a_config_that_is_not_this_shape_is_refused_naming_the_key(tmp_path, change, words):
    ckpt = write_ckpt(tmp_path / "c", cfg=spec_config(**change))
    with pytest.raises(TrainConfigError, match=words) as e:
        to_recipe_drafter(ckpt, SHAPE, tmp_path / "d", "bfloat16", {})
    assert str(ckpt) in str(e.value)


def test_a_failed_export_leaves_the_previous_drafter_in_place(tmp_path):
    out = to_recipe_drafter(write_ckpt(tmp_path / "good"), SHAPE, tmp_path / "d", "bfloat16", {})
    before = (out / "model.safetensors").read_bytes()
    bad = write_ckpt(tmp_path / "bad", cfg=spec_config(mask_token_id=1))
    with pytest.raises(SpeculatorsCheckpointError):
        to_recipe_drafter(bad, SHAPE, out, "bfloat16", {})
    assert (out / "model.safetensors").read_bytes() == before


# --- slow: the real speculators ------------------------------------------------------------------------


@pytest.mark.slow
def test_real_dry_run_and_warm_start_round_trip_on_tiny_kimi(tmp_path):
    from kimidflash.config import load_config
    from kimidflash.prepare import prepare
    from kimidflash.train.speculators.cli import run_logged, speculators_argv
    from kimidflash.train.speculators.export import to_speculators

    config = load_config(CONFIGS / "cpu-kimi-tiny.env")
    prepare(config, log=lambda *_: None)
    target = str(config.model_dir)
    shape = DrafterShape.load(CONFIGS / "tiny-kimi-k2.6-dflash-draft.json")
    log = tmp_path / "speculators.log"
    quiet = lambda *_: None  # noqa: E731

    # A fresh drafter of our shape: dry run (no data read), exported, checked against the shape.
    draft = commands.write_draft_config(shape, tmp_path / "draft-config.json")
    # float32 like the shipped tiny drafter: a dry run saves in --hidden-states-dtype (bf16 by default)
    opts = commands.SpecTrainOptions(block_size=shape.block_size, seed=0, num_workers=0, hidden_states_dtype="float32")
    argv = speculators_argv(
        "train",
        *commands.train_args(
            shape,
            target,
            tmp_path / "no-data",
            tmp_path / "no-hs",
            tmp_path / "dry",
            opts,
            draft_config_path=draft,
            dry_run=True,
            log_dir=tmp_path / "logs",
        ),
    )
    run_logged(argv, log, "speculators train", echo=quiet)
    out = to_recipe_drafter(tmp_path / "dry", shape, tmp_path / "fresh", "float32", {"test": "dry run"})
    assert json.loads((out / "config.json").read_text()) == json.loads(json.dumps(shape.vllm_config("float32")))
    assert {k: tuple(v.shape) for k, v in load_file(out / "model.safetensors").items()} == shape.expected_tensors()

    # The shipped drafter as a warm start: convert, dry-run from it, back to ours, bit for bit.
    shipped = ROOT / "drafters" / "tiny-kimi-k2.6-dflash"
    served = DrafterShape.load(shipped / "config.json")
    warm = to_speculators(shipped, target, tmp_path / "warm", log, echo=quiet)
    argv = speculators_argv(
        "train",
        *commands.train_args(
            served,
            target,
            tmp_path / "no-data",
            tmp_path / "no-hs",
            tmp_path / "dry-warm",
            opts,
            from_pretrained=warm,
            dry_run=True,
            log_dir=tmp_path / "logs",
        ),
    )
    run_logged(argv, log, "speculators train", echo=quiet)
    back = to_recipe_drafter(tmp_path / "dry-warm", served, tmp_path / "back", "float32", {})
    a, b = load_file(shipped / "model.safetensors"), load_file(back / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k].float(), b[k]) for k in a)
    assert json.loads((back / "config.json").read_text()) == json.loads((shipped / "config.json").read_text())
