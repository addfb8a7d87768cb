"""The GPU path's device-independent parts, on the CPU: which device, which autocast,
batches moved whole, checkpoints read onto the CPU."""

from __future__ import annotations

import pytest
import torch

from kimidflash.errors import TrainConfigError
from kimidflash.train import device as dev
from kimidflash.train.evaluate import load_checkpoint_model, offline_acceptance
from kimidflash.train.trainer import train_loop

from .test_train_model import SHAPE, TRAIN, FakeStore, head
from .test_train_speedups import _batch


def test_auto_is_the_gpu_of_this_rank_when_torch_sees_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dev.resolve("auto") == torch.device("cpu") == dev.resolve("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert dev.resolve("auto") == torch.device("cuda", 3) == dev.resolve("cuda")
    assert dev.resolve("cpu") == torch.device("cpu")


def test_asking_for_a_gpu_torch_does_not_see_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TrainConfigError, match="train.device=cuda, but this torch"):
        dev.resolve("cuda")
    with pytest.raises(TrainConfigError, match="train.device 'tpu'"):
        dev.resolve("tpu")


@pytest.mark.parametrize(
    "device, amx, avx512_bf16, mode, on",
    [
        ("cpu", False, False, "auto", False),
        ("cpu", True, False, "auto", True),
        ("cpu", False, True, "auto", True),
        ("cuda", False, False, "auto", True),
        ("cpu", False, False, "bfloat16", True),
        ("cuda", False, False, "none", False),
        ("cpu", True, True, "none", False),
    ],
)
def test_autocast_auto_means_bf16_where_it_is_native(monkeypatch, device, amx, avx512_bf16, mode, on):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert dev.autocast_enabled(torch.device(device), mode) is on


def test_a_cpu_is_described_by_its_model_and_bf16_support(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\nflags\t: fpu\n")
    assert dev.cpu_model(str(info)) == "AMD EPYC 9R14"
    assert dev.cpu_model(str(tmp_path / "absent")) == "unknown CPU"
    monkeypatch.setattr(dev, "cpu_model", lambda: "AMD EPYC 9R14")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert dev.describe(torch.device("cpu")) == f"cpu (AMD EPYC 9R14, native bf16, torch {torch.__version__})"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert "no native bf16" in dev.describe(torch.device("cpu"))


def test_an_unknown_autocast_is_refused():
    with pytest.raises(TrainConfigError, match="train.autocast 'fp8'"):
        dev.autocast_enabled(torch.device("cpu"), "fp8")


def test_a_batch_moves_whole():
    moved = _batch().to(torch.device("meta"))
    assert all(
        getattr(moved, name).device.type == "meta"
        for name in moved.__dataclass_fields__
        if getattr(moved, name) is not None
    )
    assert moved.soft_ids is None  # no distillation targets: nothing to move


def test_a_checkpoint_is_read_onto_the_cpu_and_evaluates_there(tmp_path):
    run = tmp_path / "run"
    tc = dict(TRAIN, steps=2, device="cpu", autocast="auto")
    train_loop(SHAPE, tc, FakeStore(), *head(), run / "checkpoints", seed=0, resume=False, progress=False)
    embed, lm_head = head()
    from safetensors.torch import save_file

    (tmp_path / "target").mkdir()
    save_file({"model.embed_tokens.weight": embed}, str(tmp_path / "target" / "model.safetensors"))
    model, st = load_checkpoint_model(run, tmp_path / "target")
    assert st["step"] == 2 and all(t.device.type == "cpu" for t in st["rng"]["data"])
    res = offline_acceptance(model, FakeStore(), k=2, autocast="auto")
    assert res["drafts"] > 0 and 1.0 <= res["mean_acceptance_length"] <= 3.0


def test_the_drafter_forward_creates_every_tensor_on_its_inputs_device():
    """A tensor made on the CPU inside the forward breaks a GPU run at its first step (as RoPE's
    position table once did on an H100); the meta device finds it on any machine."""
    from kimidflash.train.trainer import build_model

    model = build_model(SHAPE, *head(), seed=0, std=0.02).to("meta")
    b = _batch().to(torch.device("meta"))
    h = model.hidden(b.feats.to(model.fc.weight.dtype), b.block_ids, b.block_pos, b.mask)
    assert h.device.type == "meta" and h.shape == (*b.block_ids.shape, SHAPE["hidden_size"])
    assert model.logits(h).shape == (*b.block_ids.shape, SHAPE["vocab_size"])
