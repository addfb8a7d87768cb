"""Topic-steered self-synthesis (Magpie's task-specific system prompts): each request written after
one steering prompt in turn, answered without it, in a folder whose tagged ids train beside an
unsteered folder's, against the scripted server over a real socket."""

from __future__ import annotations

import json

import pytest

from kimidflash.errors import DataError
from kimidflash.train.data import conversation_of, is_heldout, load_prompts, read_shard
from kimidflash.train.selfsynth import Settings, Template

from ..support.helpers import CONFIGS
from ..support.selfsynth_script import KIMI, SMOL, USERS, Scripted, jinja, run, scripted_server

STEER = ("You write Python.", "You solve maths problems.")


@pytest.fixture
def server():
    with scripted_server() as url:
        yield url


def steered_template() -> Template:
    return Template.of(jinja(SMOL), steer=STEER)


@pytest.mark.parametrize("template", [SMOL, KIMI])
def test_each_steering_prompt_replaces_the_system_turn_before_the_users_content(template):
    t = Template.of(jinja(template), steer=STEER)
    assert len(t.steered) == 2 and t.first(0) == t.steered[0] and t.first(3) == t.steered[1]
    for system, prefix in zip(STEER, t.steered, strict=True):
        assert prefix.endswith(t.prefix[-len("user<|im_middle|>") :]) and system in prefix
        assert "helpful AI assistant" not in prefix  # the default system turn is replaced, not added to
    assert Template.of(jinja(template)).first(5) == t.prefix  # unsteered: the user prefix itself


def test_a_template_that_drops_the_system_prompt_is_refused_naming_it():
    users_only = "{% for m in messages %}{% if m['role'] == 'user' %}<u>{{ m['content'] }}</u>{% endif %}{% endfor %}"
    with pytest.raises(DataError, match="system prompt before the user turn: 'You write Python.'"):
        Template.of(jinja(users_only), steer=STEER)


def test_a_steered_shard_writes_each_request_after_its_prompt_and_answers_it_without(server, tmp_path, monkeypatch):
    monkeypatch.setattr(Scripted, "bodies", [])
    template = steered_template()
    doc = run(server, tmp_path, 1, template, steer=STEER, tag="steer")
    users = sorted((b for b in Scripted.bodies if "prompt" in b), key=lambda b: b["seed"])
    assert [b["prompt"] for b in users] == [template.steered[i % 2] for i in range(9)]
    answers = [b for b in Scripted.bodies if "messages" in b]
    assert answers and all([m["role"] for m in b["messages"]] == ["user"] for b in answers)
    recs = read_shard(tmp_path / doc["shards"][0]["file"])
    assert [r.prompt for r in recs] == [USERS[0], USERS[1], USERS[7]]
    assert [r.id for r in recs] == [
        "selfsynth-steer-00000-0000",
        "selfsynth-steer-00000-0001",
        "selfsynth-steer-00000-0007",
    ]
    assert doc["shards"][0]["kept_by_steer"] == [1, 2]  # session 0 after the first prompt, 1 and 7 after the second
    saved = json.loads((tmp_path / "manifest.json").read_text())
    assert saved["settings"]["steer"] == list(STEER) and saved["template"]["steered"] == list(template.steered)
    again = run(server, tmp_path, 1, template, steer=STEER, tag="steer")  # resumes: shard 1, all duplicates
    assert again["totals"]["shards"] == 2 and again["totals"]["kept_by_steer"] == [1, 2]
    with pytest.raises(DataError, match="its settings differ"):
        run(server, tmp_path, 1, template, steer=STEER[:1], tag="steer")


def test_a_tag_is_lowercase_letters_and_a_tagged_later_turn_keeps_to_its_conversation():
    with pytest.raises(DataError, match="tag 'steer-1': lowercase letters only"):
        Settings("smollm2", tag="steer-1")
    assert conversation_of("selfsynth-steer-00003-0017-t2") == "selfsynth-steer-00003-0017"
    assert conversation_of("selfsynth-00003-0017-t2") == "selfsynth-00003-0017"
    rid = "selfsynth-steer-00001-0002"
    assert is_heldout(f"{rid}-t3", 0.5) == is_heldout(rid, 0.5)


def test_a_steered_and_an_unsteered_folder_train_in_one_run(server, tmp_path):
    run(server, tmp_path / "plain", 1)
    run(server, tmp_path / "steered", 1, steered_template(), steer=STEER, tag="steer")
    prompts = load_prompts(f"selfsynth:{tmp_path / 'plain'}+selfsynth:{tmp_path / 'steered'}", 0)
    assert len(prompts) == 6 and len({p["id"] for p in prompts}) == 6


def test_the_committed_steering_file_is_read_and_a_bad_one_is_refused_naming_it(tmp_path):
    from kimidflash.train.selfsynth_cli import steering

    prompts = steering(CONFIGS / "selfsynth-steer.json")
    assert len(prompts) == 11 and len(set(prompts)) == 11
    bad = tmp_path / "steer.json"
    for doc in ({}, {"system_prompts": []}, {"system_prompts": ["ok", " "]}, {"system_prompts": "code"}):
        bad.write_text(json.dumps(doc))
        with pytest.raises(DataError, match=f"{bad}: `system_prompts` must be a non-empty list"):
            steering(bad)


def test_the_committed_steered_folder_trains_beside_the_unsteered_one():
    """configs/train-smollm2-selfsynth-steered.json reads both committed folders, sha256-checked, with no
    id twice, and the steered manifest counts every kept request under the prompt it was written after."""
    from kimidflash.train import config as tcfg
    from kimidflash.train.data import selfsynth_records

    cfg = tcfg.load(CONFIGS / "train-smollm2-selfsynth-steered.json")
    plain, steered = (selfsynth_records(part) for part in cfg.data.prompts.split("+"))
    assert plain and steered and all(r.id.startswith("selfsynth-steer-") for r in steered)
    prompts = load_prompts(cfg.data.prompts, cfg.seed)
    assert len(prompts) == len(plain) + len(steered) == len({p["id"] for p in prompts})
    doc = json.loads((CONFIGS.parent / "drafters" / "smollm2-selfsynth-steered" / "manifest.json").read_text())
    assert doc["settings"]["steer"] == json.loads((CONFIGS / "selfsynth-steer.json").read_text())["system_prompts"]
    assert sum(doc["totals"]["kept_by_steer"]) == doc["totals"]["kept"] == len(steered)
