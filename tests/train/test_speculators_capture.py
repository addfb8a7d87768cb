"""The speculators engine's capture (train/speculators/capture.py), without a server or speculators:
the layers it asks for, the disk arithmetic and refusal, what it runs and in which order, and
what a rerun keeps. The real thing runs in test_speculators_capture_slow.py."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from kimidflash.errors import TrainConfigError
from kimidflash.train import config as train_config
from kimidflash.train import plan
from kimidflash.train.speculators import capture

from ..support.helpers import CONFIGS

GiB = 2**30


def smol_cfg(tmp_path: Path, **over):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "hidden_size": 576}))
    return train_config.load(
        CONFIGS / "train-cpu-reference.json", {"target.model_dir": str(model), "train.engine": "speculators", **over}
    )


def write_regen(run: Path, lengths=(5, 7, 9)) -> None:
    run.mkdir(parents=True, exist_ok=True)
    recs = [
        {
            "id": f"r{i}",
            "prompt": "p",
            "input_ids": list(range(n)),
            "loss_mask": [0, 0] + [1] * (n - 2),
            "finish_reason": "stop",
        }
        for i, n in enumerate(lengths)
    ]
    (run / "regen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_bytes_per_token_is_layers_times_hidden_times_the_served_dtype_plus_the_token_id():
    assert plan.element_bytes("float32") == 4
    assert plan.element_bytes("bfloat16") == plan.element_bytes("auto") == 2
    assert plan.bytes_per_token(6, 576, 4) == 6 * 576 * 4 + 8  # SmolLM2 on our float32 CPU config
    assert plan.bytes_per_token(7, 7168, 2) == 100360  # Kimi K2.6: six target layers and the last, bf16


def test_the_disk_check_counts_files_already_written_and_refuses_what_does_not_fit(tmp_path):
    out = tmp_path / "hs"
    out.mkdir()
    (out / "hs_0.safetensors").write_bytes(b"x" * 1000)
    assert capture.check_disk(tmp_path, out, 100, 50, 1.0, free=2 * GiB) == 4000
    assert capture.check_disk(tmp_path, out, 10, 50, 1.0, free=2 * GiB) == 0  # already there
    with pytest.raises(TrainConfigError) as exc:
        capture.check_disk(tmp_path, out, GiB // 50, 100, 5.0, free=6 * GiB)  # 2 GiB into 1 GiB
    msg = str(exc.value)
    assert str(tmp_path) in msg and "needs 2.0 GiB" in msg and "6.0 GiB free" in msg and "min_free_disk_gb=5" in msg


def test_the_server_captures_the_target_layers_and_then_the_last_one(tmp_path):
    assert capture.captured_layers(smol_cfg(tmp_path), 30) == [1, 8, 15, 22, 28, 29]
    kimi = train_config.load(CONFIGS / "train-kimi-tiny.json")
    assert capture.captured_layers(kimi, 4) == [0, 1, 2, 3]
    with pytest.raises(TrainConfigError):
        capture.captured_layers(smol_cfg(tmp_path), 29)  # 28 would be the last layer itself


def test_a_multimodal_checkpoint_is_given_to_prepare_data_as_its_tokenizer_alone(tmp_path):
    plain, wrapped = tmp_path / "plain", tmp_path / "wrapped"
    for d in (plain, wrapped):
        d.mkdir()
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (d / f).write_text("{}")
    (wrapped / "preprocessor_config.json").write_text("{}")
    assert capture.tokenizer_dir(plain, tmp_path / "spec") == plain
    view = capture.tokenizer_dir(wrapped, tmp_path / "spec")
    assert sorted(p.name for p in view.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert (view / "tokenizer.json").resolve() == (wrapped / "tokenizer.json").resolve()


class Fakes:
    """run_logged and served stand-ins: record what ran and write what speculators would."""

    def __init__(self, monkeypatch, layers=6, hidden=576):
        self.calls: list[list[str]] = []
        self.overrides: list[list[str]] = []
        self.layers, self.hidden = layers, hidden
        monkeypatch.setattr(capture, "speculators_argv", lambda *a: ["speculators", *a])
        monkeypatch.setattr(capture, "run_logged", self.run_logged)
        monkeypatch.setattr(capture, "served", self.served)
        monkeypatch.setattr(capture, "free_disk", lambda path: 100 * GiB)  # not this machine's disk

    def run_logged(self, argv, log_path, what, env=None, echo=print):
        self.calls.append(list(argv))
        arg = dict(zip(argv, argv[1:], strict=False))
        if argv[1] == "prepare-data":
            Path(arg["--output"]).mkdir(parents=True, exist_ok=True)
            (Path(arg["--output"]) / "state.json").write_text("{}")
        else:
            import torch
            from safetensors.torch import save_file

            Path(arg["--output"]).mkdir(parents=True, exist_ok=True)
            save_file(
                {"token_ids": torch.arange(3), "hidden_states": torch.zeros(3, self.layers, self.hidden)},
                str(Path(arg["--output"]) / "hs_0.safetensors"),
            )

    @contextlib.contextmanager
    def served(self, config, overrides, log_path):
        self.overrides.append(list(overrides))
        yield "http://127.0.0.1:9"


def test_capture_prepares_checks_the_disk_serves_and_generates_then_a_rerun_starts_nothing(tmp_path, monkeypatch):
    fakes, run = Fakes(monkeypatch), tmp_path / "run"
    write_regen(run)
    cfg = smol_cfg(tmp_path, **{"capture.concurrency": 3})
    out = capture.capture_offline(cfg, run, log=lambda s: None)
    assert out == run / "speculators" / "hidden_states"
    prep, gen = fakes.calls
    assert prep[1] == "prepare-data" and "--trust-remote-code" not in prep
    assert prep[prep.index("--seq-length") + 1] == "2047"  # cpu-reference.env's MAX_MODEL_LEN 2048, less max_tokens
    assert prep[prep.index("--data") + 1] == str(run / "speculators" / "rows.jsonl")
    assert gen[1] == "generate-offline-data" and gen[gen.index("--endpoint") + 1] == "http://127.0.0.1:9/v1"
    assert gen[gen.index("--concurrency") + 1] == "3" and "--fail-on-error" in gen
    (over,) = fakes.overrides
    assert "SPECULATIVE_METHOD=extract_hidden_states" in over and "HIDDEN_STATES_LAYERS=1,8,15,22,28,29" in over
    assert f"HIDDEN_STATES_DIR={run / 'speculators' / 'vllm-states'}" in over

    capture.capture_offline(cfg, run, log=lambda s: None)
    assert len(fakes.calls) == 2 and len(fakes.overrides) == 1  # complete: nothing ran

    write_regen(run, (5, 7, 9, 11))  # other rows: the old files' indices mean nothing now
    capture.capture_offline(cfg, run, log=lambda s: None)
    assert len(fakes.calls) == 4 and len(fakes.overrides) == 2


def test_a_full_disk_is_refused_before_the_server_starts(tmp_path, monkeypatch):
    fakes, run = Fakes(monkeypatch), tmp_path / "run"
    write_regen(run)
    monkeypatch.setattr(capture, "free_disk", lambda path: 0.5 * GiB)
    with pytest.raises(TrainConfigError, match="min_free_disk_gb"):
        capture.capture_offline(smol_cfg(tmp_path), run, log=lambda s: None)
    assert [c[1] for c in fakes.calls] == ["prepare-data"] and fakes.overrides == []


def test_files_with_another_layer_count_are_refused(tmp_path, monkeypatch):
    Fakes(monkeypatch, layers=5)  # a capture.base_url server asked for other layers
    run = tmp_path / "run"
    write_regen(run)
    cfg = smol_cfg(tmp_path, **{"capture.base_url": "http://127.0.0.1:9"})
    with pytest.raises(Exception, match=r"expected \[T, 6, 576\]"):
        capture.capture_offline(cfg, run, log=lambda s: None)
    assert not (run / "speculators" / "captured.txt").exists()
