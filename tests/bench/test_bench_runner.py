"""Whole runs against the in-process server: slot-wait accounting, multi-turn
history, warm-up exclusion, counter deltas equal to the server's truth, errors
counted per kind, and partial results when the server dies or we are stopped."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kimidflash.bench import BenchConfig, BenchError, run_benchmark, validate_result
from kimidflash.bench.runner import Runner

from ..support.fakeserver import FakeServer, Plan


def when(cond: Any, action: Any, limit: float = 10.0) -> threading.Thread:
    """Run `action` from a thread as soon as `cond()` holds (no sleeps tuned to this machine)."""

    def watch() -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end and not cond():
            time.sleep(0.005)
        action()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer(spec_tokens=3).start()
    yield s
    s.stop()


def cfg(server: FakeServer, **kw: Any) -> BenchConfig:
    base: dict[str, Any] = dict(
        base_url=server.base_url,
        model=server.model,
        sessions=2,
        turns_per_session=1,
        max_tokens=32,
        warmup=0,
        metrics_settle_timeout=1.0,
    )
    base.update(kw)
    return BenchConfig(**base)


def test_slot_waits_are_part_of_latency(server: FakeServer) -> None:
    # Each request takes >= 0.05 + 3 * 0.05 = 0.2 s; one slot for two sessions.
    server._plan = Plan(chunks=(1, 1, 1, 1), first_delay=0.05, delay=0.05)
    doc = run_benchmark(cfg(server, sessions=2, concurrency=1))
    assert validate_result(doc) == []
    assert server.max_in_flight == 1
    first, second = sorted(doc["requests"], key=lambda r: r["slot_wait_ms"])
    assert first["due_s"] == second["due_s"] == 0.0  # both due at the start of the window
    assert first["slot_wait_ms"] < 50
    assert second["slot_wait_ms"] >= first["e2el_ms"] - 20  # waited for the first to finish
    assert second["ttft_ms"] >= second["slot_wait_ms"] + 45  # TTFT counts from due, wait included
    assert second["e2el_ms"] >= 380
    assert doc["mean_slot_wait_ms"] == pytest.approx((first["slot_wait_ms"] + second["slot_wait_ms"]) / 2, abs=0.01)
    assert doc["duration"] * 1000 >= second["e2el_ms"] - 1


def test_concurrency_defaults_to_sessions(server: FakeServer) -> None:
    server._plan = Plan(chunks=(1, 1), first_delay=0.1)
    doc = run_benchmark(cfg(server, sessions=4))
    assert doc["max_concurrency"] == 4 and server.max_in_flight == 4
    assert all(r["slot_wait_ms"] < 50 for r in doc["requests"])


def test_multi_turn_sessions_send_their_history(server: FakeServer) -> None:
    server._plan = Plan(chunks=(2, 2))
    doc = run_benchmark(cfg(server, sessions=2, turns_per_session=3, think_time=0.05))
    assert doc["completed"] == 6
    longest = max(server.bodies, key=lambda b: len(b["messages"]))
    roles = [m["role"] for m in longest["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert longest["messages"][1]["content"] == "t1000 t1001 t1002 t1003 "  # the server's own answer
    by_session: dict[int, list[dict[str, Any]]] = {}
    for r in doc["requests"]:
        by_session.setdefault(r["session"], []).append(r)
    for reqs in by_session.values():
        reqs.sort(key=lambda r: r["turn"])
        for prev, nxt in zip(reqs, reqs[1:], strict=False):
            # the next turn is due think_time after the previous answer ended
            assert nxt["due_s"] * 1000 >= prev["due_s"] * 1000 + prev["e2el_ms"] + 45
        assert reqs[2]["prompt_tokens"] > reqs[0]["prompt_tokens"]


def test_tokens_and_acceptance_equal_the_server_counters(server: FakeServer) -> None:
    server._plan = Plan(chunks=(1, 4, 2, 1, 3, 4))
    doc = run_benchmark(cfg(server, sessions=3, turns_per_session=2, warmup=2, max_tokens=64))
    assert doc["warmup"] == {"requests": 2, "completed": 2, "errors": {}}
    assert len(doc["requests"]) == 6  # warm-up excluded
    sm = doc["server_metrics"]
    assert sm["available"] and sm["output_tokens_match_server"] is True
    assert doc["total_output_tokens"] == 6 * 15 == sm["generation_tokens"]
    assert sm["prompt_tokens"] == doc["total_input_tokens"]
    # per request: 5 draft steps (chunks after the first) accepting 3,1,0,2,3 of k=3
    assert doc["spec_decode_num_drafts"] == 6 * 5
    assert doc["spec_decode_draft_tokens"] == 6 * 5 * 3
    assert doc["spec_decode_accepted_tokens"] == 6 * 9
    assert doc["spec_decode_per_position_accepted_counts"] == [6 * 4, 6 * 3, 6 * 2]
    assert doc["spec_decode_acceptance_length"] == pytest.approx(1 + 9 / 5)
    assert doc["spec_decode_per_position_conditional_rates"] == pytest.approx([4 / 5, 3 / 4, 2 / 3], abs=1e-6)
    assert doc["speculative"] is True and doc["label"] == "speculative k=3"
    for r in doc["requests"]:
        assert r["output_tokens"] == 15 and len(r["itl_ms"]) == 14 and r["max_tokens_per_chunk"] == 4


def test_output_throughput_is_tokens_over_the_window(server: FakeServer) -> None:
    server._plan = Plan(chunks=(1,) * 5, delay=0.02)
    doc = run_benchmark(cfg(server, sessions=3))
    assert doc["output_throughput"] == pytest.approx(doc["total_output_tokens"] / doc["duration"], rel=1e-4)
    per_user = [r["output_tokens"] / (r["e2el_ms"] / 1000) for r in doc["requests"]]
    assert doc["mean_per_user_output_throughput"] == pytest.approx(sum(per_user) / 3, rel=1e-3)


def test_per_request_spec_stats_agree_with_the_metrics_deltas(server: FakeServer) -> None:
    server._plan = Plan(chunks=(1, 4, 1, 3, 2), per_request_spec=True)
    doc = run_benchmark(cfg(server, sessions=3, turns_per_session=2))
    prs = doc["per_request_spec_decode"]
    assert prs["requests_with_stats"] == 6
    assert doc["requests"][0]["spec_decode"]["num_spec_steps"] == 4
    assert prs["num_spec_steps"] == doc["spec_decode_num_drafts"] == 6 * 4
    assert prs["num_draft_tokens"] == doc["spec_decode_draft_tokens"]
    assert prs["num_accepted_draft_tokens"] == doc["spec_decode_accepted_tokens"] == 6 * (3 + 0 + 2 + 1)
    assert prs["acceptance_length"] == pytest.approx(doc["spec_decode_acceptance_length"])
    assert prs["per_position_acceptance_rates"] == pytest.approx(doc["spec_decode_per_position_acceptance_rates"])
    assert prs["mean_request_acceptance_length"] == pytest.approx(1 + 6 / 4)


def test_errors_are_counted_per_kind_and_never_fatal(server: FakeServer) -> None:
    faults = {1: Plan(fault="http_500"), 3: Plan(fault="error_event", fault_after=1)}
    server._plan = lambda i, body: faults.get(i, Plan(chunks=(2, 2)))
    doc = run_benchmark(cfg(server, sessions=6))
    assert validate_result(doc) == []
    assert doc["partial"] is False
    assert doc["errors"] == {"http_500": 1, "server_error_event": 1}
    assert doc["completed"] == 4 and doc["failed"] == 2
    assert doc["total_output_tokens"] == 16


def test_a_dying_server_gives_a_partial_result(server: FakeServer) -> None:
    server._plan = Plan(chunks=(1,) * 40, delay=0.05)
    when(lambda: server.counters.generation_tokens >= 6, server.die)
    t = time.perf_counter()
    doc = run_benchmark(cfg(server, sessions=2, turns_per_session=3, max_tokens=64, timeout=10))
    assert time.perf_counter() - t < 8
    assert validate_result(doc) == []
    assert doc["partial"] is True and "unreachable" in doc["partial_reason"]
    assert doc["errors"].get("disconnect", 0) + doc["errors"].get("connect", 0) >= 2
    assert doc["not_started"] >= 1 and doc["completed"] == 0
    assert doc["server_metrics"]["available"] is False and "after the window" in doc["server_metrics"]["error"]


def test_interrupt_stops_the_run_and_marks_it_partial(server: FakeServer) -> None:
    server._plan = Plan(chunks=(1,) * 50, delay=0.05)
    runner = Runner(cfg(server, sessions=3, turns_per_session=2, max_tokens=64))

    async def go() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        when(
            lambda: server.in_flight == 3 and server.counters.generation_tokens >= 9,
            lambda: loop.call_soon_threadsafe(runner.interrupt, "interrupted by test"),
        )
        return await runner.run()

    doc = asyncio.run(go())
    assert validate_result(doc) == []
    assert doc["partial"] and doc["partial_reason"] == "interrupted by test"
    assert doc["errors"] == {"cancelled": 3} and doc["not_started"] == 3
    # what was measured is kept: each cancelled request has its times, most their first token
    assert all(r["slot_wait_ms"] is not None and r["e2el_ms"] is not None for r in doc["requests"])
    assert any(r["ttft_ms"] is not None for r in doc["requests"])
    # the server stayed up, so the counters still cover the window
    assert doc["server_metrics"]["available"] is True


def test_bad_input_is_one_clear_error(server: FakeServer) -> None:
    with pytest.raises(BenchError, match="model 'nope' is not served at .*; it serves: fake-model"):
        run_benchmark(cfg(server, model="nope"))
    with pytest.raises(BenchError, match="--base-url must be an http"):
        run_benchmark(cfg(server, base_url="localhost:8262/v1"))
    with pytest.raises(BenchError, match="prompts file not found: /no/such.jsonl"):
        run_benchmark(cfg(server, prompts="/no/such.jsonl"))
    with pytest.raises(BenchError, match="is 404; is --base-url the OpenAI /v1 root"):
        run_benchmark(cfg(server, base_url=server.base_url.replace("/v1", "/api")))
    with pytest.raises(BenchError, match="recipe config not found"):
        run_benchmark(cfg(server, recipe_config="/no/such.env"))


def test_unreachable_server_is_one_clear_error() -> None:
    s = FakeServer().start()
    url = s.base_url
    s.stop()
    with pytest.raises(BenchError, match=f"cannot reach {url}"):
        run_benchmark(BenchConfig(base_url=url, model="m", sessions=1))


def test_model_defaults_to_the_only_served_one_and_api_key_is_sent() -> None:
    with FakeServer(api_key="sekret") as s:
        with pytest.raises(BenchError, match="refused the API key"):
            run_benchmark(BenchConfig(base_url=s.base_url, sessions=1, warmup=0))
        doc = run_benchmark(
            BenchConfig(base_url=s.base_url, sessions=1, warmup=0, api_key="sekret", metrics_settle_timeout=0.5)
        )
    assert doc["provenance"]["model"] == "fake-model" and doc["completed"] == 1
    assert "sekret" not in repr(doc) and doc["config"]["api_key_set"] is True
    assert doc["speculative"] is False and doc["spec_decode_num_drafts"] is None


def test_recipe_config_is_recorded_with_its_hash(server: FakeServer, tmp_path: Any) -> None:
    from kimidflash.config import load_config
    from kimidflash.paths import CONFIGS_DIR, portable

    path = CONFIGS_DIR / "cpu-tiny.env"
    doc = run_benchmark(cfg(server, recipe_config=str(path), sessions=1))
    rc = doc["provenance"]["recipe_config"]
    assert (
        rc["sha256"] == load_config(path).digest() and rc["path"] == portable(path.resolve()) == "configs/cpu-tiny.env"
    )
    assert rc["values"]["SPECULATIVE_METHOD"] == "dflash"
    assert doc["speculative"] is True and doc["label"].startswith("dflash k=")
    assert doc["provenance"]["server"]["version"] == "0.0.0-fake"
    assert doc["provenance"]["tool_version"]
    # a baseline launched from the same file with --set: the override decides the role and label
    base = run_benchmark(
        cfg(server, recipe_config=str(path), recipe_overrides={"SPECULATIVE_METHOD": "none"}, sessions=1)
    )
    rb = base["provenance"]["recipe_config"]
    assert rb["overrides"] == {"SPECULATIVE_METHOD": "none"} and rb["sha256"] == rc["sha256"]
    assert base["speculative"] is False and base["label"] == "autoregressive"


def test_recipe_set_on_the_command_line(server: FakeServer, tmp_path: Any) -> None:
    from kimidflash.bench.cli import main
    from kimidflash.paths import CONFIGS_DIR

    out = tmp_path / "b.json"
    port = server.base_url.rsplit(":", 1)[1].split("/")[0]
    assert (
        main(
            [
                "--recipe-config",
                str(CONFIGS_DIR / "cpu-tiny.env"),
                "--recipe-set",
                f"PORT={port}",
                "--recipe-set",
                "SPECULATIVE_METHOD=none",
                "--model",
                server.model,
                "--sessions",
                "1",
                "--output",
                str(out),
                "-q",
                "--no-progress",
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["config"]["base_url"] == server.base_url  # from the recipe, with the override
    assert doc["speculative"] is False
    assert main(["--base-url", server.base_url, "--recipe-set", "PORT=1"]) == 2


def test_a_fleet_is_read_as_one_and_each_server_keeps_its_share(server: FakeServer) -> None:
    """Several --metrics-url (servers behind a router): counters summed over the fleet,
    each server's tokens and share beside them; here the other server is idle."""
    from kimidflash.bench.metrics import metrics_url_for

    server._plan = Plan(chunks=(1, 4, 2, 1, 3, 4))
    with FakeServer(spec_tokens=3) as idle:
        urls = [metrics_url_for(server.base_url), metrics_url_for(idle.base_url)]
        doc = run_benchmark(cfg(server, sessions=3, metrics_urls=urls))
    assert validate_result(doc) == [] and doc["partial"] is False
    sm = doc["server_metrics"]
    assert sm["url"] == urls and sm["generation_tokens"] == doc["total_output_tokens"] == 3 * 15
    assert doc["spec_decode_acceptance_length"] == pytest.approx(1 + 9 / 5)
    assert sm["replicas"][urls[0]] == {
        "generation_tokens": 45,
        "share": 1.0,
        "spec_decode_acceptance_length": pytest.approx(1 + 9 / 5),
        "error": None,
    }
    assert sm["replicas"][urls[1]]["share"] == 0.0 and sm["replicas"][urls[1]]["generation_tokens"] == 0


def test_a_fleet_server_that_dies_drops_out_and_the_run_still_counts(server: FakeServer) -> None:
    from kimidflash.bench.metrics import metrics_url_for

    other = FakeServer(spec_tokens=3).start()
    try:
        urls = [metrics_url_for(server.base_url), metrics_url_for(other.base_url)]
        when(lambda: server.counters.generation_tokens >= 1, other.die)
        doc = run_benchmark(cfg(server, sessions=2, metrics_urls=urls))
    finally:
        other.stop()
    assert doc["partial"] is False and doc["completed"] == 2
    sm = doc["server_metrics"]
    assert sm["available"] and sm["generation_tokens"] == doc["total_output_tokens"]
    assert "after the window" in sm["replicas"][urls[1]]["error"] and sm["replicas"][urls[1]]["share"] is None
    assert any("dropped out of the fleet's counters" in n for n in doc["notes"])


def test_each_session_carries_its_id_in_the_session_header(server: FakeServer) -> None:
    doc = run_benchmark(cfg(server, sessions=3, turns_per_session=2, warmup=1, session_header="X-Session-ID"))
    assert doc["completed"] == 6
    ids = [h.get("x-session-id") for h in server.chat_headers]
    assert ids[0] is None  # the warm-up request belongs to no session
    assert sorted(ids[1:]) == sorted([f"session-0-{s}" for s in range(3)] * 2)
