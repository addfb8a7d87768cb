"""train.method eagle3 through the phase table on the seeded tiny chat target: setup checks the
head against the target, regen (hf) and capture write the records and shards at the head's
auxiliary layers, train keeps the checkpoint with the lowest held-out loss (or, with
train.select_every, the longest walk) and resumes exactly,
eval measures acceptance as a server walks, and export writes a head vLLM's loader reads."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from kimidflash.eagle3 import Eagle3Head  # noqa: E402
from kimidflash.errors import TrainConfigError  # noqa: E402
from kimidflash.train import config as tcfg  # noqa: E402
from kimidflash.train.phases import PHASES, PhaseArgs  # noqa: E402

HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 256,
    "vocab_size": 512,
    "draft_vocab_size": 128,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]},
}


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from kimidflash.cpu_reference import tiny

    path = tmp_path_factory.mktemp("tiny-target")
    tiny.build_target(path, seed=0)
    return path


def run_config(tmp_path, target, head=HEAD, **train):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "head.json").write_text(json.dumps(head))
    cfg = tmp_path / "train.json"
    cfg.write_text(
        json.dumps(
            {
                "name": "e3",
                "seed": 0,
                "run_dir": str(tmp_path / "run"),
                "drafter_config": "head.json",
                "target": {"serve_config": None, "model_dir": str(target)},
                "data": {"prompts": "synthetic:10", "heldout_fraction": 0.2, "min_free_disk_gb": 0},
                "regen": {"source": "hf", "concurrency": 5, "max_tokens": 24},
                "capture": {"source": "hf", "mode": "cache", "dtype": "float32"},
                "train": {
                    "method": "eagle3",
                    "steps": 60,
                    "batch_size": 4,
                    "lr": 3e-3,
                    "warmup_steps": 5,
                    "checkpoint_every": 20,
                    "device": "cpu",
                    "autocast": "none",
                    "ttt_steps": 3,
                    **train,
                },
                "eval": {"k": [3], "max_records": 8, "split": "train"},
                "export": {"out": str(tmp_path / "head-out"), "dtype": "float32"},
            }
        )
    )
    return tcfg.load(cfg), tmp_path / "run"


def phases(cfg, run, *names, **args):
    for name in names:
        PHASES[name](cfg, run, PhaseArgs(**args), lambda _: None)


def test_an_eagle3_head_is_set_up_captured_trained_evaluated_and_exported(tmp_path, tiny_target):
    cfg, run = run_config(tmp_path, tiny_target)
    phases(cfg, run, "setup", "regen", "capture")
    index = json.loads((run / "capture" / "index.json").read_text())
    assert index["layer_ids"] == [0, 1]  # aux ids 1 and 2: what enters layers 1 and 2 = layers 0 and 1's outputs
    phases(cfg, run, "train")
    hist = json.loads((run / "loss-history.json").read_text())
    assert hist[-1]["loss"] < hist[0]["loss"] / 2, (hist[0], hist[-1])
    held = [h["heldout_loss"] for h in hist if "heldout_loss" in h]
    assert len(held) == 3  # at each checkpoint
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=False)
    assert best["heldout_loss"] == min(held) and best["step"] == 20 * (1 + held.index(min(held)))
    phases(cfg, run, "eval")
    ev = json.loads((run / "eval.json").read_text())
    r = ev["by_k"]["3"]
    assert ev["checkpoint"] == "best.pt" and r["drafts"] > 0 and 1.0 <= r["walk"]["mean_acceptance_length"] <= 4.0
    phases(cfg, run, "export")
    out = tmp_path / "head-out"
    exported = json.loads((out / "config.json").read_text())
    head = Eagle3Head.from_config(exported)
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open has keys() but is neither iterable nor a container)
        d2t = f.get_tensor("d2t")
    head.check_tensors(shapes, 3)
    head.check_target(json.loads((tiny_target / "config.json").read_text()), "the tiny target")
    assert shapes.keys() == head.expected_tensors(2).keys() and len(d2t) == 128
    readme = (out / "README.md").read_text()  # written from the manifest and eval file, as a DFlash export's
    assert "an EAGLE-3 head trained by" in readme and "3 TTT steps" in readme
    assert f"{r['walk']['mean_acceptance_length']} as a server walks" in readme


def test_with_select_every_best_pt_is_the_checkpoint_that_walked_best_and_walks_it_again(tmp_path, tiny_target):
    """train.select_every on an EAGLE-3 run: best.pt is kept by the walk on the held-out records (as a
    DFlash run's), not by held-out loss; eval takes it, and it walks exactly the figure it was kept at."""
    from kimidflash.train.capture import ShardStore
    from kimidflash.train.eagle3_run import kept, offline_acceptance

    cfg, run = run_config(tmp_path, tiny_target, select_every=20, select_records=2)
    phases(cfg, run, "setup", "regen", "capture", "train")
    hist = json.loads((run / "loss-history.json").read_text())
    walks = {h["step"]: h["select_walk"] for h in hist if "select_walk" in h}
    assert list(walks) == [20, 40, 60]
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=False)
    assert "heldout_loss" not in best and best["walk"] == max(walks.values())
    assert best["step"] == min(s for s, w in walks.items() if w == best["walk"])
    model, st, which = kept(cfg, run)
    assert which == "best.pt" and st["step"] == best["step"]
    again = offline_acceptance(model, ShardStore(run / "capture", "heldout"), 3, 2)
    assert again["walk"]["mean_acceptance_length"] == pytest.approx(best["walk"])
    phases(cfg, run, "export")
    readme = (tmp_path / "head-out" / "README.md").read_text()
    assert "the checkpoint that walked best on 2 held-out records kept" in readme


def test_resumed_training_equals_one_run(tmp_path, tiny_target):
    cfg, run = run_config(tmp_path / "a", tiny_target, steps=30, checkpoint_every=10)
    phases(cfg, run, "setup", "regen", "capture", "train")
    whole = torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"]
    cfg2, run2 = run_config(tmp_path / "b", tiny_target, steps=30, checkpoint_every=10)
    phases(cfg2, run2, "setup", "regen", "capture")
    phases(cfg2, run2, "train", max_steps=10)
    phases(cfg2, run2, "train", resume=True)
    resumed = torch.load(run2 / "checkpoints" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_a_fine_tune_starts_from_the_head_and_its_anchor_holds_it_near(tmp_path, tiny_target):
    cfg, run = run_config(tmp_path / "init", tiny_target, steps=20)
    phases(cfg, run, "setup", "regen", "capture", "train", "export")
    start = tmp_path / "init" / "head-out"
    moved = {}
    for anchor in (0.0, 10.0):
        c, r = run_config(
            tmp_path / f"ft{anchor}", tiny_target, steps=20, lr=1e-2, init_from_drafter=str(start), anchor_l2=anchor
        )
        phases(c, r, "setup", "regen", "capture", "train")
        from safetensors.torch import load_file

        init = load_file(str(start / "model.safetensors"))
        got = torch.load(r / "checkpoints" / "last.pt", weights_only=False)["model"]
        assert torch.equal(got["d2t"], init["d2t"])  # the fine-tune keeps its start's draft vocabulary
        moved[anchor] = sum(float(((got[k].float() - init[k].float()) ** 2).sum()) for k in init if k != "d2t")
    assert moved[10.0] < moved[0.0] / 2, moved


def test_a_head_that_does_not_fit_is_refused_at_setup_by_its_field(tmp_path, tiny_target):
    cfg, run = run_config(tmp_path, tiny_target, head={**HEAD, "hidden_size": 64})
    with pytest.raises(TrainConfigError, match="hidden_size: 64, but the target has hidden_size 128"):
        phases(cfg, run, "setup")
    cfg, run = run_config(tmp_path / "x", tiny_target, anchor_l2=1.0)
    with pytest.raises(TrainConfigError, match="anchor_l2 pulls toward train.init_from_drafter"):
        phases(cfg, run, "setup")
    cfg, _ = run_config(tmp_path / "y", tiny_target, engine="speculators")
    from kimidflash.train.engines import engine_for

    with pytest.raises(TrainConfigError, match="speculators trains DFlash drafters here"):
        engine_for(cfg).check(cfg)
