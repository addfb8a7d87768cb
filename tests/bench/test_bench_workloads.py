"""Request workloads (bench/workloads.py): what each asks the server for, how a reply is
judged, and a whole run of each against the in-process server, tool calls streamed as
vLLM streams them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kimidflash.bench import BenchConfig, BenchError, run_benchmark, validate_result
from kimidflash.bench.workloads import ANSWER, ENVELOPE, TOOL, WORKLOADS, workload
from kimidflash.cli import main as cli_main

from ..support.fakeserver import FakeServer, Plan
from ..support.helpers import CONFIGS

GOOD_ANSWER = json.dumps({"title": "Tides", "answer": "The moon pulls the sea."})
GOOD_ENVELOPE = json.dumps(
    {
        "path": "src/tides.py",
        "language": "python",
        "summary": "tide table",
        "content": "def tide(hour):\n    return hour % 12\n" * 20,
    }
)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer(spec_tokens=3).start()
    yield s
    s.stop()


def run(server: FakeServer, name: str, **kw: Any) -> dict[str, Any]:
    return run_benchmark(
        BenchConfig(
            base_url=server.base_url,
            model=server.model,
            sessions=3,
            max_tokens=64,
            warmup=0,
            metrics_settle_timeout=1.0,
            workload=name,
            **kw,
        )
    )


def test_each_structured_workload_asks_for_its_schema_and_the_same_prompt():
    assert list(WORKLOADS) == ["free", "json", "tools", "envelope"]
    assert WORKLOADS["free"].fields == {} and WORKLOADS["free"].user("hi") == "hi"
    rf = WORKLOADS["json"].fields["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"] == ANSWER
    assert WORKLOADS["envelope"].fields["response_format"]["json_schema"]["schema"] == ENVELOPE
    tools = WORKLOADS["tools"].fields
    assert tools["tool_choice"] == {"type": "function", "function": {"name": TOOL}}
    assert tools["tools"][0]["function"]["strict"] is True and tools["parallel_tool_calls"] is False
    for w in WORKLOADS.values():
        assert w.user("Explain tides.").startswith("Explain tides.")
    with pytest.raises(ValueError, match="unknown workload 'yaml'; known: free, json, tools, envelope"):
        workload("yaml")


@pytest.mark.parametrize(
    "name, text, calls, finish, why",
    [
        ("json", GOOD_ANSWER, [], "stop", None),
        ("envelope", GOOD_ENVELOPE, [], "stop", None),
        ("tools", "", [{"name": TOOL, "arguments": GOOD_ANSWER}], "tool_calls", None),
        ("free", "anything at all", [], "length", None),
        ("json", GOOD_ANSWER[:20], [], "length", "cut off at max_tokens"),
        ("json", '{"title": "x"', [], "stop", "not JSON"),
        ("json", json.dumps({"title": "x"}), [], "stop", "breaks the schema: 'answer' is a required property"),
        ("json", json.dumps({"title": "x", "answer": "y", "extra": 1}), [], "stop", "breaks the schema: Additional"),
        (
            "envelope",
            json.dumps({**json.loads(GOOD_ENVELOPE), "language": "cobol"}),
            [],
            "stop",
            "breaks the schema: 'cobol'",
        ),
        ("tools", "", [], "stop", "expected one call of reply, got []"),
        ("tools", "", [{"name": "functions", "arguments": "{}"}], "tool_calls", "expected one call of reply"),
        ("tools", "", [{"name": TOOL, "arguments": "false"}], "tool_calls", "breaks the schema: False is not of type"),
    ],
)
def test_a_reply_is_judged_against_its_schema(name, text, calls, finish, why):
    got = WORKLOADS[name].problem(text, calls, finish)
    assert got is None if why is None else why in got, got


def test_a_json_run_sends_the_schema_and_counts_valid_replies(server):
    server._plan = Plan(chunks=(2, 2, 2), texts=(GOOD_ANSWER[:10], GOOD_ANSWER[10:30], GOOD_ANSWER[30:]), finish="stop")
    doc = run(server, "json")
    assert validate_result(doc) == [] and doc["completed"] == 3
    assert all(b["response_format"]["json_schema"]["schema"] == ANSWER for b in server.bodies)
    assert all(b["messages"][-1]["content"].endswith(WORKLOADS["json"].instruction) for b in server.bodies)
    assert doc["structured"] == {"workload": "json", "checked": 3, "valid": 3, "problems": {}}
    assert doc["config"]["workload"] == "json"


def test_cut_off_and_broken_replies_are_counted_by_kind_not_as_failures(server):
    plans = iter(
        [
            Plan(chunks=(1,), texts=(GOOD_ANSWER[:9],), finish="length"),
            Plan(chunks=(1,), texts=('{"title": 1, "answer": "x"}',), finish="stop"),
            Plan(chunks=(1,), texts=(GOOD_ANSWER,), finish="stop"),
        ]
    )
    server._plan = lambda idx, body: next(plans)
    doc = run(server, "json", concurrency=1)
    assert doc["completed"] == 3 and doc["failed"] == 0
    assert doc["structured"] == {
        "workload": "json",
        "checked": 3,
        "valid": 1,
        "problems": {"cut off at max_tokens": 1, "breaks the schema": 1},
    }
    assert sorted(r["problem"] or "" for r in doc["requests"])[0] == ""


def test_streamed_tool_call_arguments_are_joined_and_judged(server):
    server._plan = Plan(
        chunks=(1, 1, 1), texts=(GOOD_ANSWER[:7], GOOD_ANSWER[7:15], GOOD_ANSWER[15:]), finish="tool_calls", tool=TOOL
    )
    doc = run(server, "tools")
    assert doc["structured"]["valid"] == 3 and doc["total_output_tokens"] == 9
    assert all(b["tool_choice"]["function"]["name"] == TOOL for b in server.bodies)


def test_free_text_records_no_structured_section(server):
    doc = run(server, "free")
    assert doc["structured"] is None and all(r["problem"] is None for r in doc["requests"])


def test_structured_workloads_refuse_ignore_eos_and_unknown_names(server):
    with pytest.raises(BenchError, match="--ignore-eos with --workload envelope: a structured reply ends"):
        run(server, "envelope", ignore_eos=True)
    with pytest.raises(BenchError, match="--workload 'xml': known are free, json, tools, envelope"):
        run(server, "xml")


def test_the_sweep_takes_the_workload_as_a_client_setting(tmp_path, capsys):
    out = tmp_path / "s"
    assert (
        cli_main(
            [
                "sweep",
                str(CONFIGS / "cpu-tiny.env"),
                "--workload",
                "free",
                "envelope",
                "--concurrency",
                "1",
                "--out",
                str(out),
                "--dry-run",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "[wfree]" in printed and "[wenvelope]" in printed and "--workload envelope  (x3)" in printed
    assert cli_main(["sweep", str(CONFIGS / "cpu-tiny.env"), "--workload", "yaml", "--out", str(out)]) == 2
    assert "workload 'yaml' is not one of free, json, tools, envelope" in capsys.readouterr().err
    assert (
        cli_main(["sweep", str(CONFIGS / "cpu-tiny.env"), "--workload", "json", "--ignore-eos", "--out", str(out)]) == 2
    )
    assert "--ignore-eos with the json workload" in capsys.readouterr().err
