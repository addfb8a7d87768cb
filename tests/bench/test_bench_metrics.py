"""Prometheus parsing, before/after deltas and the per-position acceptance math."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from kimidflash.bench import server
from kimidflash.bench.metrics import (
    ACCEPTED_PER_POS,
    DRAFTS,
    GENERATION_TOKENS,
    MetricsError,
    Snapshot,
    delta,
    metrics_url_for,
    parse_prometheus,
    spec_decode_fields,
    spec_decode_stats,
    stats_from_counts,
)

TEXT_BEFORE = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:generation_tokens_total{engine="0",model_name="other"} 999.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
"""

# 40 more drafts of k=3: 30 accepted pos 0, 18 of those pos 1, 6 of those pos 2.
TEXT_AFTER = """\
vllm:generation_tokens_total{engine="0",model_name="m"} 180.0
vllm:generation_tokens_total{engine="1",model_name="m"} 70.0
vllm:generation_tokens_total{engine="0",model_name="other"} 5000.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 50.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 66.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 37.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 22.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 4.0
"""


def test_parse_labels_values_and_escapes() -> None:
    s = parse_prometheus(
        'a_total{x="q\\"uote",y="back\\\\slash",z="new\\nline"} 2.5 1712345678\nb 1e3\nc{} NaN\nd +Inf\n'
    )
    assert s[("a_total", (("x", 'q"uote'), ("y", "back\\slash"), ("z", "new\nline")))] == 2.5
    assert s[("b", ())] == 1000.0
    assert math.isnan(s[("c", ())])
    assert s[("d", ())] == math.inf


def test_parse_rejects_garbage_naming_the_line() -> None:
    with pytest.raises(MetricsError, match="not metrics at all"):
        parse_prometheus("ok_total 1\nnot metrics at all !!\n")


def test_snapshot_keeps_counters_of_our_model_only() -> None:
    snap = Snapshot.from_text(TEXT_BEFORE, 0.0, model="m")
    assert snap.total(GENERATION_TOKENS) == 150.0  # both engines, not the other model, not _created
    assert all(name.endswith("_total") for name, _ in snap.counters)  # the running gauge is dropped
    assert Snapshot.from_text(TEXT_BEFORE, 0.0).total(GENERATION_TOKENS) == 1149.0


def test_delta_sums_engines_and_starts_lazy_children_at_zero() -> None:
    d = delta(Snapshot.from_text(TEXT_BEFORE, 10.0, "m"), Snapshot.from_text(TEXT_AFTER, 12.5, "m"))
    assert d.seconds == 2.5
    assert d.total(GENERATION_TOKENS) == (180 - 100) + (70 - 50)
    assert d.totals()["vllm:request_success_total"] == 4.0  # appeared during the window
    assert d.by_label(ACCEPTED_PER_POS, "position") == {"0": 30.0, "1": 18.0, "2": 6.0}
    assert d.reset == []


def test_delta_flags_counters_that_went_backwards() -> None:
    d = delta(Snapshot.from_text(TEXT_AFTER, 0, "m"), Snapshot.from_text(TEXT_BEFORE, 1, "m"))
    assert GENERATION_TOKENS in d.reset and DRAFTS in d.reset


def test_spec_decode_math_from_cumulative_position_counters() -> None:
    d = delta(Snapshot.from_text(TEXT_BEFORE, 0, "m"), Snapshot.from_text(TEXT_AFTER, 1, "m"))
    s = spec_decode_stats(d)
    assert s is not None
    assert (s.num_drafts, s.draft_tokens, s.accepted_tokens) == (40.0, 120.0, 54.0)
    assert s.per_position_counts == (30.0, 18.0, 6.0)
    assert s.accepted_tokens == sum(s.per_position_counts)  # prefix counts add up to accepted
    assert s.acceptance_rate == pytest.approx(54 / 120)
    assert s.acceptance_length == pytest.approx(1 + 54 / 40)
    assert s.per_position_rates == pytest.approx([30 / 40, 18 / 40, 6 / 40])
    assert s.conditional_rates == pytest.approx([30 / 40, 18 / 30, 6 / 18])
    assert s.num_speculative_tokens == 3
    f = spec_decode_fields(s)
    assert f["spec_decode_acceptance_length"] == pytest.approx(2.35)
    assert f["spec_decode_per_position_acceptance_rates"] == [0.75, 0.45, 0.15]


def test_no_spec_counters_means_no_spec_stats() -> None:
    plain = 'vllm:generation_tokens_total{model_name="m"} 5\n'
    d = delta(Snapshot.from_text(plain, 0, "m"), Snapshot.from_text(plain.replace("5", "9"), 1, "m"))
    assert spec_decode_stats(d) is None
    assert spec_decode_fields(None)["spec_decode_acceptance_rate"] is None


def test_zero_drafts_gives_none_rates_not_division_errors() -> None:
    s = stats_from_counts(0, 0, 0, [0, 0])
    assert s.acceptance_rate is None and s.acceptance_length is None
    assert s.per_position_rates == [None, None] and s.conditional_rates == [None, None]


def test_combined_pools_counts() -> None:
    a = stats_from_counts(10, 20, 8, [6, 2])
    b = stats_from_counts(30, 60, 12, [10, 2])
    c = a.combined(b)
    assert (c.num_drafts, c.draft_tokens, c.accepted_tokens, c.per_position_counts) == (40, 80, 20, (16, 4))


def test_metrics_url_is_at_the_server_root() -> None:
    assert metrics_url_for("http://h:8262/v1") == "http://h:8262/metrics"
    assert metrics_url_for("http://h:8262/v1/") == "http://h:8262/metrics"
    assert metrics_url_for("http://h:8262") == "http://h:8262/metrics"


def test_background_metrics_keys_positions_and_sums_engines() -> None:
    """The slow tests' counter reader (kimidflash.bench.metrics.scrape) parses with the same parser."""
    from kimidflash.bench import BenchConfig, run_benchmark
    from kimidflash.bench.metrics import scrape as metrics

    from ..support.fakeserver import FakeServer, Plan

    with FakeServer(Plan(chunks=(1, 2, 3)), spec_tokens=3) as s:
        run_benchmark(BenchConfig(base_url=s.base_url, sessions=2, warmup=0, metrics_settle_timeout=0.3))
        m = metrics(s.base_url.removesuffix("/v1"))
    # per request: drafts after the first chunk are (2 -> 1 accepted) and (3 -> 2 accepted)
    assert m["vllm:generation_tokens_total"] == 12
    assert m["vllm:spec_decode_num_drafts_total"] == 4 and m["vllm:spec_decode_num_accepted_tokens_total"] == 6
    assert [m[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] for i in range(3)] == [4, 2, 0]


def _replica(gen: float, drafts: float, accepted_by_pos: list[float], t0: float = 0.0):
    """One replica's window: counters from zero to these values."""
    lines = [
        f'vllm:generation_tokens_total{{model_name="m"}} {gen}',
        f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {drafts}',
        f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {drafts * len(accepted_by_pos)}',
        f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {sum(accepted_by_pos)}',
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{i}"}} {c}'
        for i, c in enumerate(accepted_by_pos)
    ]
    return delta(Snapshot.from_text("", t0), Snapshot.from_text("\n".join(lines) + "\n", t0 + 10.0 + gen / 100))


def test_a_fleet_reads_as_one_server_and_each_replica_keeps_its_share() -> None:
    from kimidflash.bench.metrics import merged, shares

    a, b, c = _replica(300, 100, [60, 30]), _replica(100, 40, [10, 2]), _replica(0, 0, [])
    fleet = merged([a, b, c])
    assert fleet.total(GENERATION_TOKENS) == a.total(GENERATION_TOKENS) + b.total(GENERATION_TOKENS) == 400
    s = spec_decode_stats(fleet)
    assert (s.num_drafts, s.accepted_tokens, s.per_position_counts) == (140, 102, (70, 32))
    assert s.acceptance_length == pytest.approx(1 + 102 / 140)  # pooled, not the mean of the replicas' lengths
    assert fleet.seconds == max(a.seconds, b.seconds, c.seconds)
    assert shares({"a": a, "b": b, "c": c}) == {"a": 0.75, "b": 0.25, "c": 0.0}
    assert shares({"idle": c}) == {"idle": None}


def _scrape_through(handler) -> Snapshot:
    async def go() -> Snapshot:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await server.scrape(client, "http://stub/metrics", {}, "m")

    return asyncio.run(go())


def test_a_scrape_that_times_out_once_is_tried_again(monkeypatch) -> None:
    monkeypatch.setattr(server.asyncio, "sleep", _no_sleep)
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ReadTimeout("loaded host", request=request)
        return httpx.Response(200, text=TEXT_BEFORE)

    assert _scrape_through(handler).total(GENERATION_TOKENS) == 150.0 and len(calls) == 2


def test_a_server_that_never_answers_fails_the_scrape_after_its_tries(monkeypatch) -> None:
    monkeypatch.setattr(server.asyncio, "sleep", _no_sleep)
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(httpx.ConnectError):
        _scrape_through(handler)
    assert len(calls) == server.SCRAPE_TRIES


async def _no_sleep(_s: float) -> None:
    return None
