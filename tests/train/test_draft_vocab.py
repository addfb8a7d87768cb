"""A drafter's own head over a draft vocabulary: which tokens, the vLLM checkpoint form, and the
offline walk measuring exactly the drafts the served drafter can make."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kimidflash.errors import TrainConfigError
from kimidflash.formats.drafter import DrafterShape
from kimidflash.train import evaluate as ev
from kimidflash.train.data import Record
from kimidflash.train.draft_vocab import attach, choose, coverage, draft_vocab_ids
from kimidflash.train.draft_vocab_cli import main
from kimidflash.train.warmstart import drafter_tensors

from .test_train_model import FakeStore, head
from .test_train_warmstart_drafter import _exported


def _rec(rid, answer):
    return Record(rid, "p", [1, 2] + answer, [0, 0] + [1] * len(answer), "stop")


RECORDS = [_rec("a", [40, 40, 40, 41, 41, 7]), _rec("b", [40, 41, 42, 2])]


def test_choose_takes_the_frequent_answers_then_the_lowest_ids():
    assert choose(RECORDS, 5, 50, frequent=0.4).tolist() == [0, 1, 2, 40, 41]  # 40, 41 by frequency; 0-2 fill
    assert choose(RECORDS, 4, 50, frequent=0.0).tolist() == [0, 1, 2, 3]
    assert choose(RECORDS, 3, 50, frequent=1.0).tolist() == [2, 40, 41]  # ties (2, 7, 42) by smaller id
    assert choose(RECORDS, 50, 50).tolist() == list(range(50))
    assert coverage(RECORDS, choose(RECORDS, 5, 50, frequent=0.4)) == 0.8  # all but 7 and 42


@pytest.mark.parametrize(
    "size, frequent, words",
    [
        (0, 0.5, "size 0: must be in 1..50"),
        (51, 0.5, "size 51: must be in 1..50"),
        (8, 1.5, "frequent share 1.5: must be in 0..1"),
    ],
)
def test_choose_refuses_impossible_sizes(size, frequent, words):
    with pytest.raises(TrainConfigError, match=words):
        choose(RECORDS, size, 50, frequent)


def _target(tmp_path):
    """A tied-embedding target checkpoint whose head is test_train_model.head()."""
    d = tmp_path / "target"
    d.mkdir(exist_ok=True)
    save_file({"model.embed_tokens.weight": head()[0].contiguous()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"tie_word_embeddings": True, "vocab_size": 50}))
    return d


def test_attach_writes_vllms_draft_vocab_form_and_the_walk_drafts_only_from_it(tmp_path, monkeypatch):
    src, drafter = _exported(tmp_path)
    (drafter / "offline-acceptance.json").write_text("{}")  # the full-vocabulary drafter's figures
    (drafter / "README.md").write_text("trained by ...")
    ids = torch.tensor([0, 2, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47])
    target = _target(tmp_path)
    out = attach(drafter, target, ids, tmp_path / "dv", {"rule": "test"})

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 15 and cfg["tie_word_embeddings"] is False
    t = load_file(str(out / "model.safetensors"))
    assert torch.equal(t["lm_head.weight"], head()[0][ids])  # the target's rows, as stored
    assert torch.equal(t["d2t"] + torch.arange(15), ids)  # vLLM: target id = draft id + d2t[draft id]
    assert torch.equal(draft_vocab_ids(out), ids)
    assert json.loads((out / "draft-vocab.json").read_text())["tokens"] == 15
    assert (out / "README.md").is_file() and not (out / "offline-acceptance.json").exists()
    # what the drafter learned is unchanged, and a new run may start from it
    shape = DrafterShape.coerce(json.loads((drafter / "config.json").read_text()))
    assert drafter_tensors(out, shape).keys() == drafter_tensors(drafter, shape).keys()

    monkeypatch.setattr(ev, "load_target_head", lambda _: head())
    model = ev.load_exported_model(out, "target-unused")
    with torch.no_grad():
        h = torch.randn(6, 3, 64)
        pred = model.predict(h)
        assert set(pred.flatten().tolist()) <= set(ids.tolist())
        assert torch.equal(pred, ids[(h @ head()[0][ids].t()).argmax(-1)])
    full = attach(drafter, target, torch.arange(50), tmp_path / "dv-all", {"rule": "test"})
    assert ev.offline_acceptance(ev.load_exported_model(full, "t"), FakeStore(), 3, 5) == ev.offline_acceptance(
        src.eval(), FakeStore(), 3, 5
    )


def test_attach_refuses_a_second_vocabulary_and_a_target_that_does_not_fit(tmp_path):
    _, drafter = _exported(tmp_path)
    target = _target(tmp_path)
    out = attach(drafter, target, torch.arange(10), tmp_path / "dv", {})
    with pytest.raises(TrainConfigError, match="already has a draft vocabulary"):
        attach(out, target, torch.arange(5), tmp_path / "dv2", {})
    small = tmp_path / "small"
    small.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(40, 64)}, str(small / "model.safetensors"))
    (small / "config.json").write_text("{}")
    with pytest.raises(TrainConfigError, match=r"head \[40, 64\] does not fit"):
        attach(drafter, small, torch.arange(10), tmp_path / "dv3", {})
    assert not (tmp_path / "dv3").exists()
    t = load_file(str(out / "model.safetensors"))
    del t["lm_head.weight"]
    save_file(t, str(out / "model.safetensors"))
    with pytest.raises(TrainConfigError, match="needs both lm_head.weight and d2t"):
        draft_vocab_ids(out)


def test_cli_names_a_missing_file_and_records_its_sources(tmp_path, capsys):
    _, drafter = _exported(tmp_path)
    records = tmp_path / "regen.jsonl"
    records.write_text("".join(json.dumps(r.__dict__) + "\n" for r in RECORDS))
    argv = [str(drafter), "--target", str(_target(tmp_path)), "--size", "8", "--out", str(tmp_path / "dv")]
    with pytest.raises(TrainConfigError, match="nope.jsonl: no such file"):
        main([*argv, "--records", str(tmp_path / "nope.jsonl")])
    assert main([*argv, "--records", str(records)]) == 0
    m = json.loads((tmp_path / "dv" / "draft-vocab.json").read_text())
    assert m["record_count"] == 2 and m["record_answer_coverage"] == 0.9 and m["records"][0]["sha256"]
    assert "8 of 50 tokens" in capsys.readouterr().out
