"""`./train-drafter.sh CONFIG --plan`: the arithmetic, and the refusals (memory, disk, no GPU, our trainer)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kimidflash.errors import TrainConfigError
from kimidflash.train import config as tcfg
from kimidflash.train import plan as tplan
from kimidflash.train.engines import make_plan

from ..support.helpers import CONFIGS, ROOT

K26 = CONFIGS / "train-kimi-k2.6.json"
MI300X = {
    "cluster.nodes": 1,
    "cluster.gpus_per_node": 8,
    "cluster.gpu_memory_gb": 192,
    "cluster.gpu_tflops": 1307,
    "cluster.disk_gb": 14000,
}


def _k26(**over):
    return tcfg.load(K26, {**MI300X, "train.engine": "speculators", **over})


def test_k26_drafter_has_the_parameter_count_the_review_found():
    trainable, vocab_matrix = tplan.drafter_params(_k26().shape())
    assert 3.4e9 < trainable < 3.6e9  # "about 3.5B parameters"
    assert vocab_matrix == 163840 * 7168


def test_k26_on_8_mi300x_fits_with_fsdp_and_each_line_is_its_arithmetic(tmp_path):
    cfg = _k26()
    data = tplan.count_data(cfg, tmp_path, samples=90_000, tokens_per_sample=1500)
    plan = make_plan(cfg, tmp_path, data)
    assert plan.refusals == [], plan.text()
    P, VH = tplan.drafter_params(cfg.shape())
    lines = {x.what: x.bytes for x in plan.memory}
    assert lines["drafter, gradients, AdamW (sharded)"] == 16 * P / 8
    assert lines["frozen vocabulary matrices (sharded)"] == 12 * VH / 8
    assert plan.per_rank == sum(lines.values()) < 0.9 * 192 * 2**30
    per_token = 7 * 7168 * 2 + 8  # six target layers and the final one, bf16, plus the token id
    assert tplan.capture_bytes_per_token(cfg.shape()) == per_token
    assert plan.disk_need == 90_000 * 1500 * per_token
    T = tplan.packed(cfg)[0]
    assert plan.steps == min(cfg.train.steps, cfg.speculators.epochs * -(-(90_000 * 1500) // (8 * T)))
    assert plan.seconds == pytest.approx(
        plan.steps * tplan.training_flops_per_step(cfg.shape(), cfg) / (1307e12 * cfg.cluster.mfu)
    )
    half = make_plan(_k26(**{"cluster.mfu": cfg.cluster.mfu / 2}), tmp_path, data)
    assert half.seconds == pytest.approx(2 * plan.seconds)
    assert "fits" in plan.text()


def test_more_ranks_shard_the_optimizer_state_thinner(tmp_path):
    one = {x.what: x.bytes for x in tplan.speculators_memory(_k26().shape(), _k26(**{"cluster.nodes": 1}))}
    two = {x.what: x.bytes for x in tplan.speculators_memory(_k26().shape(), _k26(**{"cluster.nodes": 2}))}
    assert two["drafter, gradients, AdamW (sharded)"] == one["drafter, gradients, AdamW (sharded)"] / 2
    assert two["gathered root weights"] == one["gathered root weights"]  # gathered whole on every rank


def test_capture_that_cannot_fit_the_disk_is_refused_with_what_fits(tmp_path):
    cfg = _k26()
    plan = make_plan(cfg, tmp_path, tplan.count_data(cfg, tmp_path, samples=1_160_000, tokens_per_sample=1500))
    assert len(plan.refusals) == 1 and "captured hidden states need" in plan.refusals[0]
    fit = int((14000 - cfg.data.min_free_disk_gb) * 2**30 // tplan.capture_bytes_per_token(cfg.shape()))
    assert f"about {fit} tokens fit" in plan.refusals[0]


def test_too_little_gpu_memory_is_refused_naming_what_to_change(tmp_path):
    cfg = _k26(**{"cluster.gpu_memory_gb": 24})
    plan = make_plan(cfg, tmp_path, tplan.count_data(cfg, tmp_path, samples=10, tokens_per_sample=100))
    assert any("does not fit" in r and "cluster.gpus_per_node" in r for r in plan.refusals), plan.refusals


def test_speculators_without_gpus_is_refused_unless_a_dry_run(tmp_path):
    disk = {"cluster.disk_gb": 100}  # stated, so the plan does not read this machine's free disk
    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", {"train.engine": "speculators", **disk})
    data = tplan.count_data(cfg, tmp_path, samples=10, tokens_per_sample=100)
    assert any("speculators trains on GPUs" in r for r in make_plan(cfg, tmp_path, data).refusals)
    cfg = tcfg.load(
        CONFIGS / "train-cpu-reference.json", {"train.engine": "speculators", "speculators.dry_run": True, **disk}
    )
    assert make_plan(cfg, tmp_path, data).refusals == []


def test_our_trainer_is_refused_for_k26_naming_the_speculators_engine(tmp_path, monkeypatch):
    cfg = _k26(**{"train.engine": "ours"})
    plan = make_plan(cfg, tmp_path, tplan.count_data(cfg, tmp_path, samples=10, tokens_per_sample=100))
    assert any("train.engine=speculators" in r for r in plan.refusals), plan.text()
    monkeypatch.setattr(tplan, "memory_bytes", lambda device: 192 * 2**30)
    with pytest.raises(TrainConfigError, match="train.engine=speculators") as exc:
        tplan.check_ours(cfg, None, "cuda (an MI300X)")
    assert "cuda (an MI300X)" in str(exc.value)
    small = tcfg.load(CONFIGS / "train-cpu-reference.json")
    tplan.check_ours(small, None, "the CPU")  # the reference drafter fits 192 GiB


def test_count_data_reads_the_runs_training_split(tmp_path):
    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", {"data.heldout_fraction": 0.5})
    recs = [
        {
            "id": f"r{i}",
            "prompt": "p",
            "input_ids": [1] * (i + 2),
            "loss_mask": [0] + [1] * (i + 1),
            "finish_reason": "stop",
        }
        for i in range(20)
    ]
    (tmp_path / "regen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    data = tplan.count_data(cfg, tmp_path)
    from kimidflash.train.data import is_heldout

    kept = [r for r in recs if not is_heldout(r["id"], 0.5)]
    assert 0 < data.samples == len(kept) < 20
    assert data.tokens == sum(len(r["input_ids"]) for r in kept)


def test_plan_command_prints_the_plan_and_exits_2_when_refused(tmp_path):
    def plan(*extra: str) -> subprocess.CompletedProcess:
        sets = [a for k, v in MI300X.items() for a in ("--set", f"{k}={v}")]
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "kimidflash",
                "train",
                str(K26),
                "--plan",
                *sets,
                "--set",
                "train.engine=speculators",
                "--run-dir",
                str(tmp_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )

    ok = plan("--samples", "90000", "--tokens-per-sample", "1500")
    assert ok.returncode == 0, ok.stderr
    assert "memory per rank" in ok.stdout and "fits" in ok.stdout
    assert not (tmp_path / "manifest.json").exists()  # a plan runs nothing
    bad = plan("--samples", "1160000", "--tokens-per-sample", "1500")
    assert bad.returncode == 2
    assert "REFUSED" in bad.stdout and "does not fit" in bad.stderr
    missing = plan("--samples", "10")
    assert missing.returncode == 2 and "--tokens-per-sample" in missing.stderr


@pytest.mark.parametrize(
    ("key", "bad", "choices"),
    [
        ("engine", "deepspeed", "ours, speculators"),
        ("method", "medusa", "dflash, eagle3"),
        ("device", "tpu", "auto, cpu, cuda"),
        ("autocast", "fp8", "auto, bfloat16, none"),
    ],
)
def test_a_choice_outside_its_literal_is_refused_naming_the_key(tmp_path, key, bad, choices):
    with pytest.raises(TrainConfigError, match=f'--set train.{key}={bad}: expected one of {choices}, got "{bad}"'):
        tcfg.load(K26, {f"train.{key}": bad})
    raw = json.loads(K26.read_text())
    raw["train"][key] = bad
    (tmp_path / "t.json").write_text(json.dumps(raw))
    with pytest.raises(TrainConfigError, match=f"t.json: train.{key}: expected one of {choices}"):
        tcfg.load(tmp_path / "t.json")


def test_without_records_the_prompts_count_at_their_longest_answer_capped_by_regen_records(tmp_path):
    cfg = tcfg.load(
        CONFIGS / "train-cpu-reference.json",
        {"data.prompts": "synthetic:1000", "data.heldout_fraction": 0.1, "regen.max_tokens": 100},
    )
    data = tplan.count_data(cfg, tmp_path)
    assert (data.samples, data.tokens) == (900, 900 * (tplan.PROMPT_TOKENS + 100))
    capped = tplan.count_data(
        tcfg.load(CONFIGS / "train-cpu-reference.json", {"regen.records": 200, "data.heldout_fraction": 0.0}), tmp_path
    )
    assert capped.samples == 200


def test_an_evaluation_only_run_is_never_trained(tmp_path):
    from kimidflash.train.phases import PHASES, PhaseArgs

    cfg = tcfg.load(CONFIGS / "eval-real-bigbench-heldout.json")
    assert cfg.data.heldout_fraction == 1.0 and cfg.data.prompts == "bigbench:heldout"
    with pytest.raises(TrainConfigError, match="evaluation-only run"):
        PHASES["train"](cfg, tmp_path, PhaseArgs())


K26_EAGLE3 = CONFIGS / "train-kimi-k2.6-eagle3.json"


def test_k26_eagle3_head_on_8_mi300x_fits_one_replica_per_rank_and_each_line_is_its_arithmetic(tmp_path):
    from kimidflash.train import plan_eagle3

    cfg = tcfg.load(K26_EAGLE3)
    head = plan_eagle3.head_of(cfg)
    size = plan_eagle3.head_size(head)
    tensors = head.expected_tensors()
    assert size.trainable == sum(tplan._numel(v) for k, v in tensors.items() if k != "d2t")
    assert size.lm_head == 163840 * 7168 and size.fc == 7168 * 3 * 7168 and size.n_aux == 3
    assert 1.8e9 < size.trainable < 1.9e9  # seed 002's "3B params" less the 1.17B embedding it also ships
    data = tplan.count_data(cfg, tmp_path, samples=90_000, tokens_per_sample=1500)
    plan = make_plan(cfg, tmp_path, data)
    assert plan.refusals == [] and plan.engine == "ours" and plan.method == "eagle3", plan.text()
    lines = {x.what: x.bytes for x in plan.memory}
    T, s = tplan.PROMPT_TOKENS + cfg.regen.max_tokens, cfg.train.ttt_steps
    assert lines["head, gradients, AdamW"] == 16 * size.trainable  # not divided by the ranks: a whole replica
    assert lines["anchor weights"] == 4 * size.trainable  # train.anchor_l2 with train.init_from_drafter
    assert lines["logits"] == 12 * cfg.train.batch_size * T * s * 163840
    assert plan.per_rank == sum(lines.values()) < 0.9 * 192 * 2**30
    assert plan.disk_need == 90_000 * 1500 * (3 * 7168 * 2 + 5)  # bf16 features, int32 id, int8 mask
    assert plan.seconds == pytest.approx(
        cfg.train.steps * plan_eagle3.flops_per_step(head, cfg, T) / (1307e12 * cfg.cluster.mfu)
    )
    two = make_plan(tcfg.load(K26_EAGLE3, {"cluster.nodes": 2}), tmp_path, data)
    assert two.per_rank == plan.per_rank and two.seconds == plan.seconds  # more ranks: more data per step
    assert "8 ranks" in plan.text() and "16 ranks" in two.text() and "fits" in plan.text()


@pytest.mark.parametrize(
    "over, words",
    [
        ({"train.engine": "speculators"}, "speculators 0.9.0 builds EAGLE-3 heads with Llama and Qwen3 layers only"),
        ({"capture.mode": "stream"}, "capture.mode=stream: train.method eagle3 trains on captured shards"),
        ({"train.batch_size": 16}, "per rank does not fit"),
    ],
)
def test_k26_eagle3_plan_refuses_what_our_engine_cannot_run(tmp_path, over, words):
    cfg = tcfg.load(K26_EAGLE3, over)
    plan = make_plan(cfg, tmp_path, tplan.count_data(cfg, tmp_path, samples=90_000, tokens_per_sample=1500))
    assert any(words in r for r in plan.refusals), plan.refusals


def test_k26_eagle3_plan_refuses_perfectblend_on_one_nodes_disk(tmp_path):
    cfg = tcfg.load(K26_EAGLE3)
    plan = make_plan(cfg, tmp_path, tplan.count_data(cfg, tmp_path, samples=1_160_000, tokens_per_sample=1500))
    (refusal,) = plan.refusals
    assert "captured hidden states need 69703 GiB, 13800 GiB available" in refusal and "43013 bytes" in refusal


@pytest.mark.parametrize(
    "config, refused, words",
    [
        ("train-kimi-k2.6.json", True, ["1160000 samples", "98429 samples of this data's mean length"]),
        ("train-kimi-k2.6-eagle3.json", False, ["90000 samples", "fits"]),
    ],
)
def test_the_shipped_k26_configs_plan_their_own_data_on_a_machine_without_it(tmp_path, capsys, config, refused, words):
    """A fresh machine has no PerfectBlend: the configs say what they plan for (the seed's data for the
    DFlash drafter, refused on one node's disk with the largest that fits; the head's 90k samples)."""
    from kimidflash.train.cli import main

    assert not tcfg.load(CONFIGS / config).data.prompts.startswith("synthetic")
    args = [str(CONFIGS / config), "--plan", "--run-dir", str(tmp_path)]
    if refused:
        with pytest.raises(TrainConfigError, match="does not fit"):
            main(args)
    else:
        assert main(args) == 0
    out = capsys.readouterr().out
    assert "the config's data.planned_samples" in out
    for w in words:
        assert w in out, w


@pytest.mark.parametrize("planned", [{"data.planned_samples": 10}, {"data.planned_tokens_per_sample": 0}])
def test_planned_data_needs_both_numbers(planned):
    with pytest.raises(TrainConfigError, match="data.planned_samples and data.planned_tokens_per_sample go together"):
        tcfg.load(CONFIGS / "train-cpu-reference.json", planned)


def test_count_data_counts_a_selfsynth_folders_answered_records_before_any_regen(tmp_path):
    """A self-synthesised folder holds answered records, so --plan counts them exactly, as after regen."""
    from kimidflash.train.data import is_heldout, selfsynth_records

    cfg = tcfg.load(CONFIGS / "train-smollm2-eagle3-selfsynth.json")
    data = tplan.count_data(cfg, tmp_path)  # no regen.jsonl in the run
    kept = [r for r in selfsynth_records(cfg.data.prompts) if not is_heldout(r.id, cfg.data.heldout_fraction)]
    assert data.samples == len(kept) > 1000
    assert data.tokens == sum(len(r.input_ids) for r in kept)
    assert data.source == "selfsynth:drafters/smollm2-selfsynth (training split)"
