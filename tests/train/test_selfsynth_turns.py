"""Self-synthesised sessions past their first turn (kimidflash.selfsynth --turns, --context-chars): each
later turn written and answered after the conversation, optionally after other sessions' first
exchanges, and every turn on its conversation's side of the held-out split."""

from __future__ import annotations

import json

import pytest

from kimidflash.errors import DataError
from kimidflash.train.data import read_shard

from ..support.selfsynth_script import MULTI, USERS, Scripted, run, scripted_server


@pytest.fixture
def server():
    with scripted_server() as url:
        yield url


def test_a_later_turn_is_written_after_the_conversation_and_answered_with_it(server, tmp_path):
    Scripted.bodies.clear()
    doc = run(server, tmp_path, 1, template=MULTI, turns=2)
    (entry,) = doc["shards"]
    recs = read_shard(tmp_path / entry["file"])
    first = [r for r in recs if not r.id.endswith("-t2")]
    later = [r for r in recs if r.id.endswith("-t2")]
    assert [r.prompt for r in first] == [USERS[0], USERS[1], USERS[7]]  # turn 1 as in a one-turn shard
    assert later and all(r.id.removesuffix("-t2") in {f.id for f in first} for r in later)
    answers = {b["messages"][0]["content"]: b for b in Scripted.bodies if "messages" in b and len(b["messages"]) == 1}
    for r in later:  # each second turn sampled after the first exchange and answered with the whole history
        seconds = [b for b in Scripted.bodies if len(b.get("messages", ())) == 3]
        (chat,) = [b for b in seconds if b["messages"][-1]["content"] == r.prompt]
        u1 = chat["messages"][0]["content"]
        a1 = f"Here is how: {u1[:20]}"
        assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "user"] and u1 in answers
        assert chat["messages"][1]["content"] == a1
        assert any(b.get("prompt") == MULTI.continued([u1, a1]) for b in Scripted.bodies)
    assert any(k.startswith("turn2_") for k in entry["refused"]), entry["refused"]  # named by turn
    assert entry["kept"] == len(recs) == 3 + len(later)


def test_padding_takes_other_sessions_first_exchanges_whole_within_the_budget_in_a_drawn_order():
    from kimidflash.train.selfsynth import padding

    firsts = {i: [f"user {i} " * 3, f"reply {i} " * 5] for i in range(6)}  # 21 + 40 = 61 characters each
    got = padding(firsts, 2, 200, "0:7")
    assert len(got) == 6 and sum(map(len, got)) <= 200  # three whole exchanges fit, a fourth would not
    pairs = [tuple(got[n : n + 2]) for n in range(0, len(got), 2)]
    assert all(p in {tuple(v) for j, v in firsts.items() if j != 2} for p in pairs)  # never its own
    assert got == padding(firsts, 2, 200, "0:7")  # the same salt draws the same order
    assert {padding(firsts, 2, 61, salt)[0] for salt in ("0:7", "0:8", "1:7", "3:3", "9:1")} != {got[0]}
    assert padding(firsts, 2, 60, "0:7") == []  # no exchange is cut to fit


def test_with_context_chars_a_later_turn_follows_other_conversations_and_its_own_first(server, tmp_path):
    """--context-chars: each second turn is written and answered after other sessions' first exchanges
    (whole) and then its own, so the records reach long contexts the target wrote itself."""
    Scripted.bodies.clear()
    doc = run(server, tmp_path, 1, template=MULTI, turns=2, context_chars=200)
    (entry,) = doc["shards"]
    recs = read_shard(tmp_path / entry["file"])
    first = {r.prompt for r in recs if not r.id.endswith("-t2")}
    later = [r for r in recs if r.id.endswith("-t2")]
    seconds = [b for b in Scripted.bodies if len(b.get("messages", ())) > 1]
    assert later and len(seconds) >= len(later)
    for chat in seconds:
        msgs = [m["content"] for m in chat["messages"]]
        own = msgs[-3]  # the session's own first request, then its reply, then the second turn
        pad = msgs[:-3]
        assert own in first and len(pad) % 2 == 0 and pad
        assert sum(map(len, pad)) <= 200 and own not in pad[::2]
        assert set(pad[::2]) <= first  # other sessions' first requests, each followed by its reply
        assert any(b.get("prompt") == MULTI.continued(msgs[:-1]) for b in Scripted.bodies)
    assert doc["settings"]["context_chars"] == 200


def test_a_folder_written_before_turns_existed_takes_one_turn_runs_and_refuses_two(server, tmp_path):
    run(server, tmp_path, 1)
    path = tmp_path / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["settings"]["turns"], doc["template"]["reply"], doc["template"]["next_user"]
    path.write_text(json.dumps(doc))
    assert len(run(server, tmp_path, 1)["shards"]) == 2
    with pytest.raises(DataError, match="its settings differ"):
        run(server, tmp_path, 1, template=MULTI, turns=2)


def test_every_turn_of_a_conversation_falls_on_the_side_of_the_split_its_first_turn_did():
    """A later turn's prompt holds the earlier turns: were it trained on while they are held out (or
    the reverse), the held-out walk would read text the drafter learned."""
    from kimidflash.train.data import conversation_of, is_heldout

    assert conversation_of("selfsynth-00003-0017-t2") == "selfsynth-00003-0017"
    assert conversation_of("selfsynth-00003-0017") == "selfsynth-00003-0017"
    assert conversation_of("syn-0-00012") == "syn-0-00012"  # other sources keep their own ids
    firsts = [f"selfsynth-00000-{i:04d}" for i in range(400)]
    held = [r for r in firsts if is_heldout(r, 0.17)]
    assert 30 < len(held) < 110  # the fraction still holds out about 17%
    for r in firsts:
        assert all(is_heldout(f"{r}-t{t}", 0.17) == is_heldout(r, 0.17) for t in (2, 3, 8))
