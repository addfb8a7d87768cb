"""Prompt sources: the built-in set, JSONL and ShareGPT files, session dealing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimidflash.bench import prompts as P


def test_builtin_set_is_large_and_diverse() -> None:
    convs = P.load_builtin()
    assert len(convs) >= 100
    kinds = P.kinds(convs)
    assert {"reasoning", "math", "code", "summarisation", "chit-chat", "multi-turn"} <= set(kinds)
    assert min(kinds.values()) >= 10
    assert sum(1 for c in convs if len(c.turns) >= 3) >= 15  # real multi-turn conversations
    assert len({c.id for c in convs}) == len(convs)
    assert len({c.turns[0] for c in convs}) == len(convs)  # no duplicate openers


def test_jsonl_accepts_prompt_turns_and_messages(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "one"}),
                "",
                json.dumps({"turns": ["two", "two b"], "kind": "math"}),
                json.dumps(
                    {
                        "messages": [
                            {"role": "system", "content": "s"},
                            {"role": "user", "content": "three"},
                            {"role": "assistant", "content": "x"},
                            {"role": "user", "content": "three b"},
                        ]
                    }
                ),
            ]
        )
    )
    convs = P.load_file(f)
    assert [c.turns for c in convs] == [("one",), ("two", "two b"), ("three", "three b")]
    assert convs[1].kind == "math"


def test_sharegpt_keeps_human_turns_and_skips_empty_records(tmp_path: Path) -> None:
    f = tmp_path / "sg.json"
    f.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [
                        {"from": "human", "value": "hi"},
                        {"from": "gpt", "value": "hello"},
                        {"from": "human", "value": "how are you"},
                    ],
                },
                {"id": "b", "conversations": [{"from": "gpt", "value": "only the bot"}]},
            ]
        )
    )
    convs = P.load_file(f)
    assert [(c.id, c.turns) for c in convs] == [("a", ("hi", "how are you"))]


def test_bad_files_name_the_culprit(tmp_path: Path) -> None:
    with pytest.raises(P.PromptError, match="prompts file not found: .*nope.jsonl"):
        P.load_file(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(P.PromptError, match=r"bad.jsonl:2: not JSON"):
        P.load_file(bad)
    keyless = tmp_path / "keyless.jsonl"
    keyless.write_text('{"text": "ok"}\n')
    with pytest.raises(P.PromptError, match=r"keyless.jsonl:1: no 'turns'"):
        P.load_file(keyless)


def test_session_turns_are_seeded_padded_and_keep_warmup_apart() -> None:
    convs = P.load_builtin()
    a, warm_a = P.session_turns(convs, sessions=8, turns=5, seed=7, reserve=3)
    b, warm_b = P.session_turns(convs, sessions=8, turns=5, seed=7, reserve=3)
    c, _ = P.session_turns(convs, sessions=8, turns=5, seed=8, reserve=3)
    assert a == b and warm_a == warm_b and a != c
    assert all(len(t) == 5 for t in a)
    firsts = {t[0] for t in a}
    assert len(firsts) == 8 and not firsts & set(warm_a) and len(warm_a) == 3
    padded = [t for t in a if any(x in P.GENERIC_FOLLOW_UPS for x in t)]
    assert padded  # conversations shorter than 5 turns continue with follow-ups


def test_more_sessions_than_prompts_reuses_conversations() -> None:
    convs = [P.Conversation("x", "k", ("only",))]
    turns, warm = P.session_turns(convs, sessions=3, turns=1, seed=0, reserve=2)
    assert turns == [["only"]] * 3 and warm == ["only", "only"]


def test_export_writes_the_prompts_a_run_sends(tmp_path: Path) -> None:
    from kimidflash.bench import BenchConfig, run_benchmark
    from kimidflash.bench.cli import main

    from ..support.fakeserver import FakeServer, Plan

    out = tmp_path / "peer.jsonl"
    assert main(["export-prompts", "--sessions", "5", "--seed", "3", "--warmup", "1", "-o", str(out)]) == 0
    exported = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    with FakeServer(Plan(chunks=(1,))) as s:
        run_benchmark(BenchConfig(base_url=s.base_url, sessions=5, seed=3, warmup=1, metrics_settle_timeout=0.3))
        sent = [b["messages"][-1]["content"] for b in s.bodies[1:]]  # after the warm-up request
    assert sorted(sent) == sorted(exported) and len(set(exported)) == 5


def test_traffic_in_the_formats_operators_keep_it(tmp_path: Path) -> None:
    """One file mixing an OpenAI Batch API chat line, a Batch completions line, a chat-completion
    request body with content parts and a ShareGPT conversation line: each becomes its user turns,
    assistant turns dropped (the server answers), ids and categories kept."""
    f = tmp_path / "traffic.jsonl"
    f.write_text(
        "\n".join(
            json.dumps(o)
            for o in [
                {
                    "custom_id": "req-1",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "kimi",
                        "metadata": {"category": "code"},
                        "messages": [
                            {"role": "system", "content": "be brief"},
                            {"role": "user", "content": "fix this"},
                            {"role": "assistant", "content": "which?"},
                            {"role": "user", "content": "the loop"},
                        ],
                    },
                },
                {
                    "custom_id": "req-2",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": {"model": "kimi", "prompt": "Once"},
                },
                {
                    "model": "kimi",
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": "describe"},
                                {"type": "image_url", "image_url": {"url": "x"}},
                                {"type": "text", "text": "this chart"},
                            ],
                        }
                    ],
                },
                {
                    "id": "sg",
                    "conversations": [
                        {"from": "human", "value": "hi"},
                        {"from": "gpt", "value": "hello"},
                        {"from": "human", "value": "more"},
                    ],
                },
            ]
        )
        + "\n"
    )
    convs = P.load_file(f)
    assert [(c.id, c.kind, c.turns) for c in convs] == [
        ("req-1", "code", ("fix this", "the loop")),
        ("req-2", "unknown", ("Once",)),
        ("2", "unknown", ("describe\nthis chart",)),
        ("sg", "unknown", ("hi", "more")),
    ]


@pytest.mark.parametrize(
    "line, words",
    [
        ({"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}, "'/v1/embeddings'"),
        ({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}, "no 'messages'"),
        ({"messages": [{"role": "assistant", "content": "only me"}]}, "no non-empty user turn"),
        ({"input": "x"}, "Batch API line"),
    ],
)
def test_a_bad_traffic_line_is_named_by_its_number(tmp_path: Path, line: dict, words: str) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(P.PromptError) as e:
        P.load_file(f)
    assert str(e.value).startswith(f"{f}:2: ") and words in str(e.value), str(e.value)
