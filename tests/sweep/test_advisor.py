"""The speculative-token advisor: its model on known profiles, its cost fits, its command."""

from __future__ import annotations

import json

import pytest

from kimidflash import cli
from kimidflash.errors import AdviceError
from kimidflash.sweep.advisor import (
    DEFAULT_COST,
    SEED_OUTCOMES,
    SEED_PROFILE,
    CostModel,
    advise,
    cost_from_run,
    cumulative,
    fit_cost,
    tokens_per_step,
)

from ..support.helpers import ROOT

HELDOUT = ROOT / "benchmarks" / "drafter" / "heldout"


def speedups(advice):
    return {p.k: p.speedup for p in advice.predictions}


def test_the_seed_profile_comes_out_at_k2_and_k8_below_no_speculation():
    advice = advise(SEED_PROFILE, DEFAULT_COST)
    s = speedups(advice)
    assert advice.recommended_k == 2 and advice.line == "recommended NUM_SPECULATIVE_TOKENS=2"
    assert s[8] < 1.0 < s[2]


def test_the_default_cost_is_a_nonnegative_fit_close_to_the_seeds_outcomes():
    assert DEFAULT_COST.draft >= 0 and DEFAULT_COST.verify > 0
    s = speedups(advise(SEED_PROFILE, DEFAULT_COST))
    for k, ratio in SEED_OUTCOMES:  # two outcomes, a linear cost kept >= 0: close, not exact
        assert abs(s[k] / ratio - 1) < 0.05, (k, s[k], ratio)


def test_a_strong_slowly_decaying_profile_wants_a_larger_k():
    strong = tuple(0.9 ** (i + 1) for i in range(16))
    assert advise(strong, DEFAULT_COST).recommended_k > 4


def test_a_known_optimum_by_hand():
    # tokens/step 1.9, 2.7, 3.2, 3.3 over costs 1.2, 1.3, 1.4, 1.5: 1.583, 2.077, 2.286, 2.200
    advice = advise((0.9, 0.8, 0.5, 0.1), CostModel(0.1, 0.1, "given"))
    assert advice.recommended_k == 3
    assert [round(p.speedup, 3) for p in advice.predictions] == [1.583, 2.077, 2.286, 2.2]


def test_the_smaller_k_wins_within_one_percent():
    # k=1: 1.5/1.1 = 1.3636; k=2: 1.6/1.17 = 1.3675 (0.3% better): k=1 is kept
    advice = advise((0.5, 0.1), CostModel(0.03, 0.07, "x"))
    assert speedups(advice)[2] > speedups(advice)[1] and advice.recommended_k == 1


def test_when_no_k_beats_no_speculation_the_answer_is_none():
    advice = advise((0.2, 0.05), CostModel(0.1, 0.3, "x"))
    assert advice.recommended_k is None and advice.line == "recommended SPECULATIVE_METHOD=none"


def test_a_cost_fitted_to_a_run_reproduces_its_measured_ratio():
    profile = (0.7, 0.4, 0.2, 0.1)
    cost = cost_from_run(profile, 4, 1.25, draft=0.05, source="run")
    assert abs(tokens_per_step(profile, 4) / cost.step_cost(4) - 1.25) < 1e-3
    with pytest.raises(AdviceError, match="faster"):
        cost_from_run(profile, 4, 3.0, draft=0.05, source="run")


def test_rates_are_checked_and_conditional_ones_multiplied_out():
    assert cumulative([0.8, 0.5], conditional=True) == pytest.approx((0.8, 0.4))
    with pytest.raises(AdviceError, match="rise at position 1"):
        cumulative([0.3, 0.5])
    with pytest.raises(AdviceError, match="rate 0"):
        cumulative([1.5])
    with pytest.raises(AdviceError, match="drafted nothing"):
        cumulative([])


def test_the_command_on_the_seeds_published_profile(capsys):
    assert cli.main(["advise", "--per-position", ",".join(map(str, SEED_PROFILE))]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "recommended NUM_SPECULATIVE_TOKENS=2"


def test_the_command_fits_costs_to_a_run_and_its_baseline(tmp_path, capsys):
    """A committed CPU-reference run at k=7 over its baseline: the fit reproduces the
    measured ratio at k=7 and no k beats no speculation there."""
    out = tmp_path / "advice.json"
    run, base = HELDOUT / "shipped-k7-c8.json", HELDOUT / "no-speculation-c8.json"
    assert cli.main(["advise", str(run), "--baseline", str(base), "--json", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "recommended SPECULATIVE_METHOD=none"
    doc = json.loads(out.read_text())
    measured = json.loads(run.read_text())["output_throughput"] / json.loads(base.read_text())["output_throughput"]
    assert doc["predictions"][-1]["k"] == 7 and abs(doc["predictions"][-1]["speedup"] - measured) < 1e-3
    assert doc["line"] == "recommended SPECULATIVE_METHOD=none" and doc["recommended_k"] is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            [str(HELDOUT / "shipped-k7-c8.json"), "--baseline", str(HELDOUT / "no-speculation-c1.json")],
            "same concurrency",
        ),
        (
            [str(HELDOUT / "shipped-k7-c8.json"), "--baseline", str(HELDOUT / "shipped-k3-c8.json")],
            "not a no-speculation",
        ),
        (["--per-position", "0.5,x"], "numbers separated by commas"),
        (["--per-position", "0.5", "--verify-cost", "-1"], "must be >= 0"),
        ([], "one of the two"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(["advise", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("name", ["seed-profile", "cpu-reference-k7-c8", "cpu-reference-k7-c1"])
def test_the_committed_advice_files_are_what_the_advisor_says_today(name, tmp_path, capsys):
    """docs/acceptance-analysis.md and benchmarks/advisor/LOG.md quote these files: rerun their commands and compare."""
    committed = json.loads((ROOT / "benchmarks" / "advisor" / f"{name}.json").read_text())
    argv = committed["provenance"]["command"].split()[2:]
    out = tmp_path / "again.json"
    i = argv.index("--json")
    argv[i + 1] = str(out)
    argv = [str(ROOT / a) if a.startswith("benchmarks/") else a for a in argv]
    assert cli.main(["advise", *argv]) == 0
    again = json.loads(out.read_text())
    assert again["predictions"] == committed["predictions"] and again["line"] == committed["line"]
    assert again["cost"] == committed["cost"]


def test_runs_at_other_k_fit_both_costs_and_predict_small_k_better(tmp_path, capsys):
    """The committed sweep at concurrency 4: k=7 alone (draft cost 0) overrates k=1;
    adding the k=1 and k=3 runs fits the drafting cost too and gets k=1 closer."""
    pts = ROOT / "benchmarks" / "sweep" / "cpu-reference" / "points"
    run, base = pts / "k7" / "c4-r1.json", pts / "none" / "c4-r1.json"
    ratio = {
        k: json.loads((pts / f"k{k}" / "c4-r1.json").read_text())["output_throughput"]
        / json.loads(base.read_text())["output_throughput"]
        for k in (1, 3, 7)
    }
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert cli.main(["advise", str(run), "--baseline", str(base), "--json", str(one)]) == 0
    assert (
        cli.main(
            [
                "advise",
                str(run),
                "--baseline",
                str(base),
                "--also",
                str(pts / "k1" / "c4-r1.json"),
                str(pts / "k3" / "c4-r1.json"),
                "--json",
                str(two),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip().splitlines()[-1] == "recommended SPECULATIVE_METHOD=none"
    one, two = json.loads(one.read_text()), json.loads(two.read_text())
    profile = tuple(two["profile"])
    fitted = fit_cost(profile, [(k, ratio[k]) for k in (7, 1, 3)], "")
    assert (two["cost"]["draft"], two["cost"]["verify"]) == (fitted.draft, fitted.verify) and fitted.draft > 0
    assert two["inputs"]["measured_ratios"] == {str(k): round(ratio[k], 4) for k in (7, 1, 3)}
    at_k1 = lambda doc: next(p["speedup"] for p in doc["predictions"] if p["k"] == 1)  # noqa: E731
    assert abs(at_k1(two) - ratio[1]) < abs(at_k1(one) - ratio[1])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--also", str(HELDOUT / "shipped-k3-c8.json")], "it needs --baseline"),
        (
            ["--baseline", str(HELDOUT / "no-speculation-c8.json"), "--also", str(HELDOUT / "no-speculation-c8.json")],
            "not a speculative run",
        ),
        (
            ["--baseline", str(HELDOUT / "no-speculation-c8.json"), "--also", str(HELDOUT / "shipped-k3-c1.json")],
            "same concurrency",
        ),
    ],
)
def test_also_is_checked(extra, message, capsys):
    assert cli.main(["advise", str(HELDOUT / "shipped-k7-c8.json"), *extra]) == 2
    assert message in capsys.readouterr().err


# --- the fixed part of a DFlash step's cost, from the weights it reads (sweep/drafting.py) ---------------


def _checkpoint(d, tensors: dict, config: dict | None = None):
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.zeros(shape, dtype=dt) for k, (shape, dt) in tensors.items()}, str(d / "model.safetensors"))
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d


def test_the_fixed_draft_cost_is_what_a_draft_step_reads_over_a_target_step(tmp_path):
    import torch

    from kimidflash.sweep.drafting import fixed_draft_cost, target_step_bytes

    f32, bf16 = torch.float32, torch.bfloat16
    # a dense target with tied embeddings: 100 x 8 embedding (= head) + one layer of 8 x 8 + a norm
    target = _checkpoint(
        tmp_path / "t",
        {
            "model.embed_tokens.weight": ((100, 8), f32),
            "model.layers.0.mlp.up_proj.weight": ((8, 8), f32),
            "model.norm.weight": ((8,), f32),
        },
        {"tie_word_embeddings": True, "vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 1},
    )
    drafter = _checkpoint(tmp_path / "d", {"layers.0.mlp.up_proj.weight": ((8, 8), bf16), "fc.weight": ((8, 16), bf16)})
    assert target_step_bytes(target, 1) == (4 * (800 + 64 + 8), 4 * 800)
    assert fixed_draft_cost(target, drafter, 1) == round((2 * 192 + 3200) / 3488, 4)  # stored bytes
    assert fixed_draft_cost(target, drafter, 1, "float32") == round((4 * 192 + 3200) / 3488, 4)  # served upcast
    # a draft vocabulary: the drafter reads its own 30-row head, not the target's
    dv = _checkpoint(
        tmp_path / "dv",
        {
            "layers.0.mlp.up_proj.weight": ((8, 8), bf16),
            "fc.weight": ((8, 16), bf16),
            "lm_head.weight": ((30, 8), f32),
            "d2t": ((30,), torch.int64),
        },
    )
    assert fixed_draft_cost(target, dv, 1) == round((2 * 192 + 4 * 240 + 8 * 30) / 3488, 4)


def test_a_moe_target_reads_the_experts_a_batch_can_touch_and_never_its_vision_tower(tmp_path):
    import torch

    from kimidflash.sweep.drafting import target_step_bytes

    bf16 = torch.bfloat16
    lm = "language_model.model."
    tensors = {
        f"{lm}embed_tokens.weight": ((50, 4), bf16),
        "language_model.lm_head.weight": ((50, 4), bf16),
        f"{lm}layers.0.self_attn.o_proj.weight": ((4, 4), bf16),
        f"{lm}norm.weight": ((4,), bf16),
        "vision_tower.blocks.0.weight": ((64, 64), bf16),
    }
    tensors |= {f"{lm}layers.0.mlp.experts.{e}.down_proj.weight": ((4, 4), bf16) for e in range(8)}
    tensors[f"{lm}layers.0.mlp.shared_experts.down_proj.weight"] = ((4, 4), bf16)
    target = _checkpoint(
        tmp_path / "k",
        tensors,
        {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {
                "n_routed_experts": 8,
                "num_experts_per_tok": 2,
                "vocab_size": 50,
                "hidden_size": 4,
                "num_hidden_layers": 1,
            },
        },
    )
    head, dense, experts = 2 * 200, 2 * (16 + 4 + 16), 2 * 8 * 16
    assert target_step_bytes(target, 1) == (head + dense + experts // 4, head)  # 2 of 8 experts per token
    assert target_step_bytes(target, 3) == (head + dense + experts * 6 // 8, head)
    assert target_step_bytes(target, 64) == (head + dense + experts, head)  # every expert, at most
