"""Acceptance by prompt length: the buckets, the pooling, the result field and the compare table (fast tier)."""

from __future__ import annotations

import json

import pytest

from kimidflash.bench import lengths, run_benchmark
from kimidflash.bench.report import compare

from ..support.fakeserver import Plan
from .test_bench_runner import cfg, server  # noqa: F401  (the fixture)


def test_buckets_cover_every_length_once_and_are_named_by_their_edges():
    assert [b.label for b in lengths.BUCKETS] == ["0-128", "128-512", "512-2K", "2K-8K", "8K-32K", "32K-128K", "128K+"]
    for n in (0, 127, 128, 511, 512, 2047, 2048, 131071, 131072, 10**7):
        (b,) = [b for b in lengths.BUCKETS if b.low <= n and (b.high is None or n <= b.high)]
        assert lengths.bucket_of(n) == b
    assert lengths.bucket_of(127).label == "0-128" and lengths.bucket_of(128).label == "128-512"


def test_each_bucket_pools_only_its_own_requests():
    a = {
        "num_spec_steps": 10,
        "num_draft_tokens": 30,
        "num_accepted_draft_tokens": 12,
        "acceptance_histogram": [3, 4, 2, 1],
    }
    b = {
        "num_spec_steps": 5,
        "num_draft_tokens": 15,
        "num_accepted_draft_tokens": 2,
        "acceptance_histogram": [3, 2, 0, 0],
    }
    rows = lengths.by_prompt_length([(100, a), (3000, b), (120, a), (None, b), (50, None)])
    assert [r["prompt_tokens"] for r in rows] == ["0-128", "2K-8K"]
    short, long = rows
    assert short["requests_with_stats"] == 2 and short["num_spec_steps"] == 20 and short["acceptance_length"] == 2.2
    assert short["per_position_acceptance_rates"] == [0.7, 0.3, 0.1]
    assert long["acceptance_length"] == pytest.approx(1.4) and long["min_prompt_tokens"] == 2048
    assert lengths.by_prompt_length([(None, a), (10, None)]) is None


def test_the_result_file_splits_the_per_request_stats_by_prompt_length_and_compare_shows_them(server, tmp_path):  # noqa: F811
    """Eight-turn sessions: each turn's prompt holds the earlier ones, so the requests fall in two
    buckets, which together hold every request and every draft step the server counted."""
    server._plan = Plan(chunks=(1, 4, 1, 3, 2), per_request_spec=True)
    doc = run_benchmark(cfg(server, sessions=2, turns_per_session=8, max_tokens=200))
    rows = doc["per_request_spec_decode_by_prompt_length"]
    for r in doc["requests"]:
        (row,) = [x for x in rows if x["prompt_tokens"] == lengths.bucket_of(r["prompt_tokens"]).label]
    assert [x["prompt_tokens"] for x in rows] == ["0-128", "128-512"]
    assert sum(x["requests_with_stats"] for x in rows) == 16
    assert sum(x["num_spec_steps"] for x in rows) == doc["spec_decode_num_drafts"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    report = compare([path], markdown=tmp_path / "report.md", terminal=False)
    assert "### Acceptance by prompt length" in report.markdown
    table = next(t for t in report.tables if t.title == "Acceptance by prompt length")
    assert [row[1] for row in table.rows] == [x["prompt_tokens"] for x in rows]
    assert [row[4] for row in table.rows] == [f"{x['acceptance_length']:.2f}" for x in rows]


def test_without_per_request_stats_there_is_no_length_table(server, tmp_path):  # noqa: F811
    server._plan = Plan(chunks=(1, 4, 1))
    doc = run_benchmark(cfg(server, sessions=2))
    assert doc["per_request_spec_decode_by_prompt_length"] is None
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    assert all(t.title != "Acceptance by prompt length" for t in compare([path], terminal=False).tables)
