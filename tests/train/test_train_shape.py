"""The drafter shape and the typed training options (fast tier)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from kimidflash.errors import RecipeError
from kimidflash.formats.drafter import DrafterShape
from kimidflash.formats.drafter_export import export_model
from kimidflash.train import config as tcfg
from kimidflash.train.trainer import build_model

from ..support.helpers import CONFIGS, ROOT
from .test_train_model import SHAPE, head


def write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"train.steps": "abc"}, '--set train.steps=abc: expected an integer, got "abc"'),
        ({"train.lr": True}, "--set train.lr=true: expected a number, got true"),
        ({"eval.k": ["3"]}, '--set eval.k=["3"]: expected a list of integers'),
    ],
)
def test_a_set_override_of_the_wrong_type_is_refused(over, needle):
    with pytest.raises(tcfg.TrainConfigError) as e:
        tcfg.load(CONFIGS / "train-cpu-reference.json", over)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, RecipeError)


def test_a_wrong_type_in_the_file_is_refused_with_the_file_and_key(tmp_path):
    p = write(tmp_path, "t.json", {"drafter_config": "x.json", "train": {"steps": "800"}})
    with pytest.raises(tcfg.TrainConfigError, match=r't.json: train.steps: expected an integer, got "800"'):
        tcfg.load(p)
    p = write(tmp_path, "u.json", {"drafter_config": "x.json", "seed": 1.5})
    with pytest.raises(tcfg.TrainConfigError, match=r"u.json: seed: expected an integer, got 1.5"):
        tcfg.load(p)


def test_options_are_typed_sections_that_still_read_as_the_json():
    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", tcfg.parse_set(["train.steps=7"]))
    assert cfg.train.steps == 7
    assert cfg.as_dict()["train"]["steps"] == 7 and cfg.as_dict()["_path"] == cfg.path
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 8  # frozen


def test_cli_refuses_a_bad_set_value_in_one_line():
    p = subprocess.run(
        [str(ROOT / "train-drafter.sh"), "configs/train-cpu-reference.json", "--set", "train.steps=abc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "KIMIDFLASH_PYTHON": sys.executable},
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.steps=abc: expected an integer" in lines[0]


def test_shape_refuses_the_targets_last_layer(tmp_path):
    shape = json.loads((CONFIGS / "smollm2-dflash-draft.json").read_text())
    shape["dflash_config"]["target_layer_ids"] = [1, 29]
    with pytest.raises(tcfg.TrainConfigError, match=r"d.json: .*never the last layer"):
        DrafterShape.load(write(tmp_path, "d.json", shape))
    ok = DrafterShape.from_dict(
        dict(shape, num_target_layers=None, dflash_config={"mask_token_id": 16, "target_layer_ids": [1, 28]})
    )
    ok.check_target(30)
    with pytest.raises(tcfg.TrainConfigError, match="last layer"):
        ok.check_target(29)


def test_shape_refuses_two_different_rope_thetas(tmp_path):
    shape = dict(SHAPE, rope_theta=10000.0, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    with pytest.raises(tcfg.TrainConfigError) as e:
        DrafterShape.load(write(tmp_path, "d.json", shape))
    msg = str(e.value)
    assert "d.json" in msg and "10000.0" in msg and "500000.0" in msg and "\n" not in msg
    same = dict(shape, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    assert DrafterShape.from_dict(same).rope_theta == 10000.0


@pytest.mark.parametrize(
    "fields",
    [
        {"rope_theta": 20000.0},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 30000.0}},
        {},
    ],
)
def test_model_and_export_read_the_same_head_dim_and_rope_theta(tmp_path, fields):
    raw = {k: v for k, v in SHAPE.items() if k not in ("rope_theta", "head_dim")} | fields
    shape = DrafterShape.from_dict(raw)
    model = build_model(shape, *head(), seed=0, std=0.1)
    assert model.head_dim == shape.head_dim == 64 // 4
    assert model.layers[0].self_attn.hd == shape.head_dim
    out = export_model(model.state_dict(), shape, tmp_path / "d", "float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == model.theta == shape.rope_theta
    assert shape.rope_theta == (
        fields.get("rope_theta") or fields.get("rope_parameters", {}).get("rope_theta") or 1000000.0
    )


def test_the_tiny_reference_drafter_is_written_by_the_exporter(tmp_path):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3Model"):
        pytest.skip("transformers without Qwen3")
    from kimidflash.cpu_reference import tiny

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 128, "num_hidden_layers": 3}))
    tiny.build_drafter(tmp_path / "draft", target, seed=0, mask_token_id=3)
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    shape = DrafterShape.from_dict(cfg)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "draft" / "model.safetensors"), "pt") as f:
        got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open has keys() but is neither iterable nor a container)
        assert got == shape.expected_tensors()
        assert f.get_tensor("fc.weight").dtype == torch.float32
    assert cfg["architectures"] == ["DFlashDraftModel"] and "layer_types" not in cfg
    assert cfg["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": tiny.TARGET_LAYER_IDS}
    assert tiny.is_current(tmp_path / "draft")
