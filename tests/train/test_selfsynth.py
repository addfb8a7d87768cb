"""Self-synthesised conversations (kimidflash.selfsynth): the template's user prefix, the filters,
near-duplicate and contamination checks, and resumable shards with a manifest, against a scripted
server over a real socket."""

from __future__ import annotations

import gzip
import json

import pytest

from kimidflash.errors import DataError
from kimidflash.train.data import read_shard, verify_shards
from kimidflash.train.selfsynth import Settings, Template
from kimidflash.train.selfsynth_text import Contamination, Diversity, Limits, NearDuplicates, refusal

from ..support.selfsynth_script import EVAL, KIMI, SMOL, USERS, Scripted, jinja, run, scripted_server


@pytest.mark.parametrize(
    "template, prefix, stop",
    [
        (SMOL, "<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\n", "<|im_end|>"),
        (KIMI, "<|im_user|>user<|im_middle|>", "<|im_end|>"),
    ],
)
def test_the_user_prefix_is_the_template_up_to_the_users_content(template, prefix, stop):
    assert Template.of(jinja(template)) == Template(prefix, stop)


@pytest.mark.parametrize(
    "template, reply, next_user",
    [
        (SMOL, "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n"),
        (KIMI, "<|im_end|><|im_assistant|>assistant<|im_middle|>", "<|im_end|><|im_user|>user<|im_middle|>"),
    ],
)
def test_a_later_turn_follows_the_conversation_as_the_template_renders_it(template, reply, next_user):
    t = Template.of(jinja(template), turns=2)
    assert (t.reply, t.next_user) == (reply, next_user) and Template.of(jinja(template)).reply == ""
    render = jinja(template)
    history = ["Q1", "A1", "Q2", "A2"]
    whole = render([{"role": ("user", "assistant")[n % 2], "content": m} for n, m in enumerate([*history, "Q3"])])
    assert whole.startswith(t.continued(history)) and whole[len(t.continued(history)) :].startswith("Q3")
    with pytest.raises(DataError, match="whole exchanges"):
        t.continued(["Q1"])
    with pytest.raises(DataError, match="second user turn"):  # a template that drops replies
        Template.of(
            jinja("{% for m in messages %}{% if m['role'] == 'user' %}U:{{ m['content'] }};{% endif %}{% endfor %}"), 2
        )


def test_a_template_without_a_user_content_is_refused():
    with pytest.raises(DataError, match="no user prefix"):
        Template.of(lambda m: "<|im_start|>user\n<|im_end|>")


@pytest.mark.parametrize(
    "text, why",
    [
        ("Hi there", "too_short"),
        (" ".join(["word"] * 300), "too_long"),
        ("Напишите короткое стихотворение о море и ветре", "language"),
        ("tell me more tell me more tell me more tell me more tell me more", "repetition"),
        ("How do I write a SQL query that joins two tables?", None),
    ],
)
def test_each_filter_names_its_reason(text, why):
    assert refusal(text, Limits()) == why


def test_exact_and_near_duplicates_are_caught_and_distinct_requests_pass():
    near = NearDuplicates()
    base = "Can you explain how a vineyard plans its harvest festival, from the tasting menu to the music and tickets?"
    assert near.check(base) is None
    assert near.check(base.upper() + "!") == "exact_duplicate"
    assert near.check(base.replace("tickets?", "the tickets?")) == "near_duplicate"
    assert near.check("Write a Python function that merges two sorted lists into one sorted list.") is None


def test_a_text_sharing_a_13_gram_with_an_evaluation_set_is_contaminated():
    c = Contamination([EVAL])
    assert c.hits(f"Please help: {EVAL} thanks") > 0
    assert c.hits("Given a positive number, decompose it into parts.") == 0


def test_diversity_counts_distinct_ngrams_and_openings():
    d = Diversity.of(["how do I cook rice", "how do I cook pasta", "write a poem"])
    assert d.texts == 3 and d.openings == 2 and d.top_opening_share == pytest.approx(2 / 3, abs=1e-3)
    assert 0 < d.distinct[2] < 1


@pytest.fixture
def server():
    with scripted_server() as url:
        yield url


def test_a_shard_keeps_the_answered_requests_and_counts_every_refusal(server, tmp_path):
    doc = run(server, tmp_path, 1)
    (entry,) = doc["shards"]
    assert entry["refused"] == {
        "answer_repetition": 1,
        "contaminated": 1,
        "cut_at_max_tokens": 1,
        "exact_duplicate": 1,
        "language": 1,
        "too_short": 1,
    }
    recs = read_shard(tmp_path / entry["file"])
    assert [r.prompt for r in recs] == [USERS[0], USERS[1], USERS[7]] and entry["kept"] == 3
    for r in recs:  # a regen record: the served prompt's ids, then the answer's, the loss on the answer only
        assert r.input_ids[-3:] == [7, 8, 9] and r.loss_mask == [0, 0, 0, 0, 1, 1, 1]
        assert r.id.startswith("selfsynth-00000-")
    assert doc["contamination"] == {"ngram": 13, "eval_texts": 1, "sets": {"evals": 1}, "refused": 1}
    assert entry["checked_against"] == {"evals": 1}
    assert doc["diversity"]["sample"] == 3 and set(doc["diversity"]) == {"sample", "kept", "synthetic_templates"}
    assert verify_shards(tmp_path)["totals"]["kept"] == 3


def test_every_generated_token_counts_in_the_rate_and_answers_start_before_the_last_request_is_in(
    server, tmp_path, monkeypatch
):
    """The rate is what the server generated: refused answers too. And the server is kept busy: kept
    requests are answered while later ones are still being written, in seed order all the same."""
    monkeypatch.setattr(Scripted, "slow_user", 1.0)
    monkeypatch.setattr(Scripted, "done", [])
    doc = run(server, tmp_path, 1)
    (entry,) = doc["shards"]
    assert entry["generated_tokens"] == 9 * 12 + 4 * 3  # nine users, four answers (one refused for its loop)
    assert Scripted.done.index("answer") < len(Scripted.done) - 1 - Scripted.done[::-1].index("user")
    assert [r.prompt for r in read_shard(tmp_path / entry["file"])] == [USERS[0], USERS[1], USERS[7]]


def test_a_second_run_adds_the_next_shard_and_refuses_what_earlier_shards_hold(server, tmp_path):
    run(server, tmp_path, 1)
    doc = run(server, tmp_path, 1)  # shard 1's seeds cycle the same list: every request is a duplicate now
    assert [e["file"] for e in doc["shards"]] == ["shard-00000.jsonl.gz", "shard-00001.jsonl.gz"]
    assert doc["shards"][1]["kept"] == 0 and doc["shards"][1]["refused"]["exact_duplicate"] >= 3
    assert doc["totals"]["shards"] == 2 and doc["totals"]["kept"] == 3


def test_other_settings_on_the_same_folder_are_refused_by_name(server, tmp_path):
    run(server, tmp_path, 1)
    with pytest.raises(DataError, match="its settings differ"):
        run(server, tmp_path, 1, temperature=0.7)


def test_a_shard_that_is_not_the_one_its_manifest_names_is_refused(server, tmp_path):
    doc = run(server, tmp_path, 1)
    shard = tmp_path / doc["shards"][0]["file"]
    with gzip.open(shard, "wt") as f:
        f.write("")
    with pytest.raises(DataError, match="not the shard its manifest names"):
        verify_shards(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))


def test_a_training_run_reads_the_shards_as_prompts_and_regen_copies_their_answers(server, tmp_path):
    from kimidflash.train.data import load_prompts, read_records
    from kimidflash.train.phases import _copy_selfsynth

    run(server, tmp_path / "synth", 1)
    spec = f"selfsynth:{tmp_path / 'synth'}"
    prompts = load_prompts(f"{spec}+synthetic:2", 0)
    assert [p["prompt"] for p in prompts[:3]] == [USERS[0], USERS[1], USERS[7]] and len(prompts) == 5
    out = tmp_path / "regen.jsonl"
    wanted = {p["id"] for p in prompts}
    assert len(_copy_selfsynth(f"{spec}+synthetic:2", out, set(), wanted)) == 3
    assert _copy_selfsynth(spec, out, {r.id for r in read_records(out)}, wanted) == set()  # nothing twice
    assert [r.input_ids[-3:] for r in read_records(out)] == [[7, 8, 9]] * 3


def test_a_selfsynth_folder_in_data_prompts_is_relative_to_the_config_as_other_paths_are(tmp_path):
    from kimidflash.train import config as tcfg

    from ..support.helpers import CONFIGS

    cfg = tcfg.load(CONFIGS / "train-smollm2-selfsynth.json")
    assert cfg.data.prompts == "selfsynth:" + str((CONFIGS.parent / "drafters" / "smollm2-selfsynth").resolve())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.json").write_text(
        json.dumps(
            {
                "name": "x",
                "drafter_config": str(CONFIGS / "smollm2-dflash-draft.json"),
                "data": {"prompts": "synthetic:10+selfsynth:../ss"},
            }
        )
    )
    assert tcfg.load(tmp_path / "sub" / "c.json").data.prompts == f"synthetic:10+selfsynth:{tmp_path / 'ss'}"


def test_a_manifest_records_a_selfsynth_folder_without_the_machines_layout():
    from kimidflash.train import config as tcfg
    from kimidflash.train.manifest import portable_config, portable_prompts

    from ..support.helpers import CONFIGS

    cfg = tcfg.load(CONFIGS / "train-smollm2-selfsynth.json")
    assert portable_prompts(cfg.data.prompts) == "selfsynth:drafters/smollm2-selfsynth"
    assert portable_prompts("synthetic:10+" + cfg.data.prompts) == "synthetic:10+selfsynth:drafters/smollm2-selfsynth"
    raw = json.loads((CONFIGS / "train-smollm2-selfsynth.json").read_text())
    raw["data"]["prompts"] = cfg.data.prompts
    assert portable_config(raw)["data"]["prompts"] == "selfsynth:drafters/smollm2-selfsynth"


def test_the_contamination_sets_are_named_and_bigbench_can_be_left_out(monkeypatch, capsys):
    from kimidflash.prompts_real.sets import PromptSet
    from kimidflash.train import selfsynth_cli

    def one(name: str, *turns: str):
        return lambda *a: PromptSet(name, "eval", [{"turns": list(turns)}], {})

    def gone(archive=None):
        raise AssertionError("BIG-bench was read")

    monkeypatch.setattr(selfsynth_cli, "humaneval_set", one("humaneval", "a"))
    monkeypatch.setattr(selfsynth_cli, "mtbench_set", one("mt-bench", "b", "c"))
    monkeypatch.setattr(selfsynth_cli, "bigbench_sets", gone)
    assert selfsynth_cli.eval_texts(no_bigbench=True) == {"humaneval": ["a"], "mt-bench": ["b", "c"]}
    monkeypatch.setattr(selfsynth_cli, "bigbench_sets", lambda archive=None: [one("bigbench-heldout", archive)()])
    assert selfsynth_cli.eval_texts("bb.tar.gz")["bigbench-heldout"] == ["bb.tar.gz"]
    with pytest.raises(SystemExit):
        selfsynth_cli.main(["configs/cpu-reference.env", "--out", "x", "--bigbench", "f", "--no-bigbench"])
    assert "exclude each other" in capsys.readouterr().err


def test_a_bench_result_that_cannot_be_written_is_refused_before_any_shard(tmp_path):
    from kimidflash.errors import BenchError
    from kimidflash.train import selfsynth_cli

    with pytest.raises(BenchError, match=f"cannot write --bench-result {tmp_path}: it is a directory"):
        selfsynth_cli.main(["configs/cpu-reference.env", "--out", str(tmp_path / "x"), "--bench-result", str(tmp_path)])
    assert not (tmp_path / "x").exists()


def test_the_server_is_benchmarked_on_the_kept_requests_beside_the_regens_rate(server, tmp_path):
    from kimidflash.errors import DataError
    from kimidflash.train.selfsynth_bench import bench_beside

    from ..support.fakeserver import FakeServer, Plan

    doc = run(server, tmp_path / "shards", 1)
    (entry,) = doc["shards"]
    kept = [r.prompt for r in read_shard(tmp_path / "shards" / entry["file"])]
    settings = Settings("smollm2", per_shard=9)
    with FakeServer(Plan(chunks=(1, 1, 1, 1, 1)), model="smollm2") as fake:
        root = fake.base_url.removesuffix("/v1")
        t = bench_beside(root, tmp_path / "shards", doc, 0, settings, 2, tmp_path / "bench.json")
        measured = [b for b in fake.bodies if b["max_tokens"] == settings.answer_max_tokens]  # not the warm-up's
        assert sorted(b["messages"][-1]["content"] for b in measured) == sorted(kept)
        with pytest.raises(DataError, match="3 kept requests cannot keep 4 in flight"):
            bench_beside(root, tmp_path / "shards", doc, 0, settings, 4, tmp_path / "b4.json")
    result = json.loads((tmp_path / "bench.json").read_text())
    assert t["server_output_tok_s"] == round(result["output_throughput"], 1) > 0
    assert t["regen_output_tok_s"] == round(entry["generated_tokens"] / entry["seconds"], 1)
    assert t["regen_vs_server"] == round(entry["generated_tokens"] / entry["seconds"] / result["output_throughput"], 3)
    assert t["concurrency"] == 2 and t["shards"] == [entry["file"]]
    assert json.loads((tmp_path / "shards" / "manifest.json").read_text())["throughput"] == t
