"""Batched target work: regen.source=hf, HF capture of many sequences at once, stream-mode batches.

Each runs on the CPU here and, where torch sees a GPU, on it too (the same test,
parametrized by device): the GPU path's code is the CPU path's.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from kimidflash.errors import RegenError, TrainConfigError  # noqa: E402
from kimidflash.train.capture import HFCapture, StreamStore  # noqa: E402
from kimidflash.train.data import make_record, read_records  # noqa: E402
from kimidflash.train.device import float32_matmul  # noqa: E402
from kimidflash.train.regen_hf import batches, regen_hf, split_response  # noqa: E402
from kimidflash.train.trainer import train_loop  # noqa: E402

from ..support.helpers import random_llama  # noqa: E402
from .test_train_model import SHAPE, TRAIN, head  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def llama64(tmp_path_factory):
    """A random Llama whose width, vocabulary and depth fit test_train_model.SHAPE's drafter."""
    return random_llama(
        tmp_path_factory.mktemp("llama64"),
        vocab_size=50,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
    )


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """The seeded tiny chat target (tokenizer with a chat template, an end-of-sequence token)."""
    from kimidflash.cpu_reference import tiny

    path = tmp_path_factory.mktemp("tiny-target")
    tiny.build_target(path, seed=0)
    return path


def _seqs(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(4, 50, (int(torch.randint(5, 30, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("forward_tokens", [4096, 40])  # one forward; forwards of a few sequences each
def test_capturing_many_sequences_at_once_equals_one_at_a_time(llama64, device, forward_tokens):
    src = HFCapture(
        llama64, [1, 3], dtype=torch.float32, device=torch.device(device), topk=3, forward_tokens=forward_tokens
    )
    seqs = _seqs(5)
    many = src.capture_many(seqs)
    # on a GPU the batched forward may use TF32 (capture_many's docstring); on the CPU it is float32 throughout
    tol = 1e-5 if device == "cpu" else 2e-2
    for s, c in zip(seqs, many, strict=False):
        one = src.capture_many([s])[0]
        assert c.feats.shape == (len(s), 128) and c.feats.device.type == "cpu"
        assert torch.allclose(c.feats, one.feats, atol=tol)
        assert c.topk[0].shape == (len(s), 3)
    assert torch.get_float32_matmul_precision() == "highest"  # restored after the forward


def test_length_groups_sort_by_length_and_keep_each_forward_within_the_budget():
    from kimidflash.train.capture import length_groups

    lengths = [30, 5, 12, 7, 90, 12, 6]
    groups = length_groups(lengths, 40)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))  # every sequence once
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(lengths)
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 40
    assert [lengths[i] for i in groups[-1]] == [90]  # longer than the budget: a forward of its own
    assert length_groups(lengths, 10_000) == [sorted(range(7), key=lambda i: lengths[i])]


def test_capture_in_bfloat16_is_close_to_float32_and_other_precisions_are_refused(llama64):
    from kimidflash.errors import TrainConfigError
    from kimidflash.train import config as train_config
    from kimidflash.train.capture import make_source

    from ..support.helpers import CONFIGS

    seqs = _seqs(3, seed=2)
    ref = HFCapture(llama64, [1, 3], dtype=torch.float32).capture_many(seqs)
    half = HFCapture(llama64, [1, 3], dtype=torch.float32, compute_dtype=torch.bfloat16).capture_many(seqs)
    for a, b in zip(ref, half, strict=False):
        assert a.feats.dtype == b.feats.dtype == torch.float32  # stored as asked, whatever the compute
        rel = ((a.feats - b.feats).norm() / a.feats.norm()).item()
        assert 0 < rel < 0.05
    gate = CONFIGS / "train-overfit-gate.json"
    cfg = train_config.load(gate, {"capture.source": "hf", "capture.compute_dtype": "float16"})
    with pytest.raises(TrainConfigError, match="capture.compute_dtype 'float16'"):
        make_source(cfg, llama64, [1, 3])
    cfg = train_config.load(gate, {"capture.source": "hf", "capture.forward_tokens": 0})
    with pytest.raises(TrainConfigError, match="capture.forward_tokens 0"):
        make_source(cfg, llama64, [1, 3])


def test_a_stream_store_batch_is_its_sequences_one_by_one(llama64):
    recs = [make_record(f"r{i}", "p", s[:3], s[3:], "length") for i, s in enumerate(_seqs(4, seed=1))]
    store = StreamStore(recs, HFCapture(llama64, [1, 3], dtype=torch.float32))
    batch = store.get_many([2, 0, 2])
    for got, i in zip(batch, [2, 0, 2], strict=False):
        ids, lm, f = store.get(i)
        assert torch.equal(got[0], ids) and torch.equal(got[1], lm) and torch.allclose(got[2], f, atol=1e-5)
        assert lm.tolist() == [0, 0, 0] + [1] * (len(ids) - 3)


@pytest.mark.parametrize("device", DEVICES)
def test_stream_mode_trains_with_batched_capture_on_the_device(tmp_path, llama64, device):
    recs = [make_record(f"r{i}", "p", s[:4], s[4:], "length") for i, s in enumerate(_seqs(6, seed=2)) if len(s) > 8]
    store = StreamStore(recs, HFCapture(llama64, [1, 3], dtype=torch.bfloat16, device=torch.device(device)))
    res = train_loop(
        SHAPE, dict(TRAIN, steps=3, device=device, autocast="auto"), store, *head(), tmp_path, 0, False, progress=False
    )
    assert res["step"] == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in res["history"])


def test_a_response_ends_at_its_first_stop_token_which_it_keeps():
    assert split_response([5, 6, 2, 7, 2], {2}, 10) == ([5, 6, 2], "stop")
    assert split_response([5, 6, 7], {2}, 3) == ([5, 6, 7], "length")
    assert split_response([5, 6, 7, 8], {2, 9}, 2) == ([5, 6], "length")  # padding past max_tokens is dropped


def test_float32_matmul_precision_is_restored_after_an_error():
    with pytest.raises(KeyError), float32_matmul("high"):
        assert torch.get_float32_matmul_precision() == "high"
        raise KeyError("x")
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("device", DEVICES)
def test_hf_regen_writes_served_shaped_records_and_batching_changes_no_token(tmp_path, tiny_target, device):
    from transformers import AutoTokenizer

    prompts = [
        {"id": f"p{i}", "prompt": t}
        for i, t in enumerate(
            ["Tell me about the sea.", "Hi", "Write a long story about a cat and a dog who become friends.", "Why?"]
        )
    ]
    one, four = tmp_path / "one.jsonl", tmp_path / "four.jsonl"
    dev = torch.device(device)
    assert regen_hf(tiny_target, prompts, one, batch=1, max_tokens=12, temperature=0.0, device=dev) == 4
    assert regen_hf(tiny_target, prompts, four, batch=4, max_tokens=12, temperature=0.0, device=dev) == 4
    tok = AutoTokenizer.from_pretrained(tiny_target)
    recs = {r.id: r for r in read_records(four)}
    for p in prompts:
        r = recs[p["id"]]
        n_prompt = r.loss_mask.count(0)
        text = tok.apply_chat_template(
            [{"role": "user", "content": p["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        assert r.input_ids[:n_prompt] == tok(text, add_special_tokens=False)["input_ids"]
        assert r.loss_mask == [0] * n_prompt + [1] * (len(r.input_ids) - n_prompt)
        response = r.input_ids[n_prompt:]
        assert (r.finish_reason, len(response)) == ("length", 12) or (
            r.finish_reason == "stop" and response[-1] == tok.eos_token_id and tok.eos_token_id not in response[:-1]
        )
    if device == "cpu":  # float32 on the CPU: padding a batch changes no greedy token
        assert read_records(one) and {r.id: r for r in read_records(one)} == recs
    written = [json.loads(line)["id"] for line in four.read_text().splitlines()]
    assert written[0] == "p1" and sorted(written) == sorted(recs)  # shortest first: one window, by length


def test_regen_batches_sort_by_length_within_windows_that_keep_the_set_order():
    lengths = [50, 3, 7, 2000, 9, 1, 40, 40, 5, 300, 2]
    got = batches(lengths, batch=2, window=2)
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))  # every prompt once
    assert all(1 <= len(b) <= 2 for b in got)
    windows = [got[i] + got[i + 1] if i + 1 < len(got) else got[i] for i in range(0, len(got), 2)]
    assert [sorted(w) for w in windows] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]  # the set's order kept
    for w in windows:
        assert [lengths[i] for i in w] == sorted(lengths[i] for i in w)  # by length inside a window
    assert got[:2] == [[1, 2], [0, 3]] and batches([4, 4, 4], 8) == [[0, 1, 2]]
    with pytest.raises(RegenError, match="at least 1"):
        batches(lengths, 0)


def test_hf_regen_halves_a_batch_the_device_has_no_memory_for(tmp_path, tiny_target, monkeypatch):
    from kimidflash.train import regen_hf as rh

    prompts = [{"id": f"p{i}", "prompt": t} for i, t in enumerate(["Tell me about the sea.", "Hi", "Why?"])]
    whole = tmp_path / "whole.jsonl"
    assert (
        regen_hf(tiny_target, prompts, whole, batch=1, max_tokens=6, temperature=0.0, device=torch.device("cpu")) == 3
    )
    real, sizes = rh.generate_batch, []

    def small_device(model, pad, group, *a):
        sizes.append(len(group))
        if len(group) > 1:
            raise torch.OutOfMemoryError("fake: out of memory")
        return real(model, pad, group, *a)

    monkeypatch.setattr(rh, "generate_batch", small_device)
    halved = tmp_path / "halved.jsonl"
    assert (
        regen_hf(tiny_target, prompts, halved, batch=3, max_tokens=6, temperature=0.0, device=torch.device("cpu")) == 3
    )
    assert sizes == [3, 1, 2, 1, 1] and read_records(halved) == read_records(whole)
    monkeypatch.setattr(rh, "generate_batch", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("none fits")))
    with pytest.raises(torch.OutOfMemoryError, match="none fits"):
        regen_hf(
            tiny_target,
            prompts[:1],
            tmp_path / "x.jsonl",
            batch=1,
            max_tokens=6,
            temperature=0.0,
            device=torch.device("cpu"),
        )


def test_hf_regen_refuses_sampling_and_an_empty_batch(tmp_path, tiny_target):
    p = [{"id": "a", "prompt": "x"}]
    with pytest.raises(RegenError, match="regen.temperature is 0.7"):
        regen_hf(
            tiny_target, p, tmp_path / "o.jsonl", batch=2, max_tokens=4, temperature=0.7, device=torch.device("cpu")
        )
    with pytest.raises(RegenError, match="regen.concurrency must be at least 1"):
        regen_hf(
            tiny_target, p, tmp_path / "o.jsonl", batch=0, max_tokens=4, temperature=0.0, device=torch.device("cpu")
        )
    assert not (tmp_path / "o.jsonl").exists()


def _regen_run(tmp_path, tiny_target, source="hf"):
    from kimidflash.train import config as tcfg

    from ..support.helpers import CONFIGS

    cfg_file = tmp_path / "t.json"
    cfg_file.write_text(
        json.dumps(
            {
                "drafter_config": str(CONFIGS / "smollm2-dflash-draft.json"),
                "target": {"serve_config": None, "model_dir": str(tiny_target)},
                "regen": {"source": source, "concurrency": 1, "max_tokens": 6},
                "train": {"device": "cpu"},
            }
        )
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "prompts.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": f"Say {i}."}) + "\n" for i in range(5))
    )
    return tcfg.load(cfg_file), run


def test_the_regen_phase_answers_through_hf_and_an_interrupted_run_keeps_and_counts_its_records(
    tmp_path, tiny_target, monkeypatch
):
    from kimidflash.train import regen_hf as rh
    from kimidflash.train.phases import PhaseArgs, phase_regen

    cfg, run = _regen_run(tmp_path, tiny_target)
    phase_regen(cfg, run, PhaseArgs(regen_limit=2), log=lambda _: None)
    assert [r.id for r in read_records(run / "regen.jsonl")] == ["p0", "p1"]
    note = json.loads((run / "manifest.json").read_text())["regen"]
    assert note["records"] == 2 and note["sampling"]["source"] == "hf" and note["sampling"]["device"].startswith("cpu")

    real, calls = rh.generate_batch, []

    def second_batch_interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(rh, "generate_batch", second_batch_interrupted)
    with pytest.raises(KeyboardInterrupt):
        phase_regen(cfg, run, PhaseArgs(), log=lambda _: None)
    assert [r.id for r in read_records(run / "regen.jsonl")] == ["p0", "p1", "p2"]  # resumed after p1, kept p2
    assert json.loads((run / "manifest.json").read_text())["regen"]["records"] == 3


def test_an_unknown_regen_source_is_refused_before_anything_is_written(tmp_path, tiny_target):
    from kimidflash.train.phases import PhaseArgs, phase_regen

    cfg, run = _regen_run(tmp_path, tiny_target, source="vllm")
    with pytest.raises(TrainConfigError, match="regen.source 'vllm': expected server or hf"):
        phase_regen(cfg, run, PhaseArgs(), log=lambda _: None)
    assert not (run / "manifest.json").exists() and not (run / "regen.jsonl").exists()


@pytest.mark.parametrize("device", DEVICES)
def test_memory_mode_holds_what_stream_mode_computes_and_trains_on_the_device(tmp_path, llama64, device):
    from kimidflash.train.capture import MemoryStore

    recs = [make_record(f"r{i}", "p", s[:4], s[4:], "length") for i, s in enumerate(_seqs(7, seed=3)) if len(s) > 8]
    src = HFCapture(llama64, [1, 3], dtype=torch.bfloat16, device=torch.device(device))
    mem = MemoryStore(recs, src, batch=3, log=lambda _: None)
    stream = StreamStore(recs, src)
    assert len(mem) == len(recs) and mem.feats.device.type == device
    for i in range(len(recs)):
        (ids, lm, f), (ids2, lm2, f2) = mem.get(i), stream.get(i)
        assert torch.equal(ids, ids2) and torch.equal(lm, lm2)
        assert f.device.type == device and torch.allclose(
            f.float().cpu(), f2.float(), atol=2e-2 if device == "cuda" else 1e-2
        )
    res = train_loop(
        SHAPE, dict(TRAIN, steps=3, device=device, autocast="auto"), mem, *head(), tmp_path, 0, False, progress=False
    )
    assert res["step"] == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in res["history"])


def test_memory_mode_refuses_features_that_do_not_fit_naming_the_sizes(llama64, monkeypatch):
    from kimidflash.train import capture

    recs = [make_record(f"r{i}", "p", s[:4], s[4:], "length") for i, s in enumerate(_seqs(3))]
    monkeypatch.setattr(capture, "free_bytes", lambda device: 1000)
    with pytest.raises(TrainConfigError, match=r"capture.mode=memory: 3 records' features need .* GiB, cpu has"):
        capture.MemoryStore(recs, HFCapture(llama64, [1, 3]), batch=2, log=lambda _: None)


def test_an_unknown_capture_mode_is_refused_by_name(tmp_path):
    from kimidflash.train import config as tcfg
    from kimidflash.train.capture import check_mode

    from ..support.helpers import CONFIGS

    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", {"capture.mode": "disk"})
    with pytest.raises(TrainConfigError, match="capture.mode 'disk': expected one of cache, stream, memory"):
        check_mode(cfg)


@pytest.mark.parametrize("mode", ["stream", "memory"])
def test_a_run_without_shards_notes_its_data_in_the_manifest(tmp_path, llama64, mode):
    """The export README quotes the capture note; stream and memory mode write it when training starts."""
    from kimidflash.formats.drafter import DrafterShape
    from kimidflash.train import config as tcfg
    from kimidflash.train.data import RecordWriter
    from kimidflash.train.trainer import _train_store

    from ..support.helpers import CONFIGS

    run = tmp_path / "run"
    w = RecordWriter(run / "regen.jsonl")
    w.write_many([make_record(f"syn-0-{i:05d}", "p", s[:4], s[4:], "length") for i, s in enumerate(_seqs(40, 4))])
    w.close()
    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", {"capture.mode": mode, "train.device": "cpu"})
    store = _train_store(cfg, run, DrafterShape.coerce(SHAPE), str(llama64), log=lambda _: None)
    note = json.loads((run / "manifest.json").read_text())["capture"]
    assert (note["mode"], note["train_records"], note["train_records"] + note["heldout_records"]) == (
        mode,
        len(store),
        40,
    )
    assert note["train_response_tokens"] == sum(int(store.get(i)[1].sum()) for i in range(len(store)))

    vllm = tcfg.load(
        CONFIGS / "train-cpu-reference.json",
        {"capture.mode": "memory", "capture.source": "vllm", "capture.base_url": "http://127.0.0.1:9"},
    )
    with pytest.raises(TrainConfigError, match="capture.mode=memory needs capture.source=hf"):
        _train_store(vllm, run, DrafterShape.coerce(SHAPE), str(llama64), log=lambda _: None)
