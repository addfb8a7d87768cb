"""The result file: schema validation catches what is wrong, writes are atomic."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from kimidflash.bench import (
    SCHEMA_NAME,
    SCHEMA_VERSION,
    BenchConfig,
    load_result,
    run_benchmark,
    validate_result,
    write_result,
)
from kimidflash.bench.result import client_busy_note
from kimidflash.bench.stats import percentile, summarize
from kimidflash.errors import ResultError

from ..support.fakeserver import FakeServer, Plan


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    with FakeServer(Plan(chunks=(1, 2, 2)), spec_tokens=2) as s:
        return run_benchmark(
            BenchConfig(base_url=s.base_url, sessions=3, turns_per_session=2, warmup=1, metrics_settle_timeout=0.5)
        )


def test_a_fresh_result_is_valid_and_versioned(doc: dict[str, Any]) -> None:
    assert validate_result(doc) == []
    assert doc["schema"] == SCHEMA_NAME and doc["schema_version"] == SCHEMA_VERSION
    prov = doc["provenance"]
    assert prov["tool_version"] and prov["utc_time"].endswith("Z") and prov["host"]["cpu_count"]
    assert prov["git"]["revision"] is None or len(prov["git"]["revision"]) == 40
    # field names shared with `vllm bench serve --save-result`
    for key in (
        "total_output_tokens",
        "output_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "spec_decode_acceptance_rate",
        "spec_decode_acceptance_length",
        "spec_decode_num_drafts",
        "spec_decode_draft_tokens",
        "spec_decode_accepted_tokens",
        "spec_decode_per_position_acceptance_rates",
    ):
        assert key in doc, key
    json.dumps(doc, allow_nan=False)


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda d: d.pop("total_output_tokens"), "missing total_output_tokens"),
        (lambda d: d.update(schema_version=99), "schema_version is 99"),
        (lambda d: d.update(output_throughput=-1.0), "output_throughput must be a non-negative number"),
        (lambda d: d.update(total_output_tokens=d["total_output_tokens"] + 1), "total_output_tokens differs"),
        (lambda d: d.update(partial=True, partial_reason=None), "partial result without partial_reason"),
        (lambda d: d["errors"].update(timeout=1), "errors do not add up to failed"),
        (lambda d: d["provenance"].pop("server"), "missing provenance.server"),
        (lambda d: d["requests"][0]["itl_ms"].pop(), "ITLs for"),
        (lambda d: d.update(not_started=5), "completed + failed + not_started != num_prompts"),
        (lambda d: d.update(partial="no"), "partial has type str"),
    ],
)
def test_validation_names_the_problem(doc: dict[str, Any], mutate: Any, problem: str) -> None:
    bad = copy.deepcopy(doc)
    mutate(bad)
    problems = validate_result(bad)
    assert any(problem in p for p in problems), problems


def test_write_is_atomic_and_replaces(doc: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "deep" / "r.json"
    write_result(target, {"old": True})
    write_result(target, doc)
    assert load_result(target) == doc
    assert sorted(os.listdir(target.parent)) == ["r.json"]


def test_a_failed_write_leaves_the_old_file(doc: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    write_result(target, doc)
    with pytest.raises(ValueError):
        write_result(target, {"x": float("nan")})  # not valid JSON: refused mid-write
    assert load_result(target) == doc
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_load_result_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ResultError, match="result file not found: .*none.json"):
        load_result(tmp_path / "none.json")
    (tmp_path / "t.json").write_text("{trunc")
    with pytest.raises(ResultError, match="t.json: not JSON"):
        load_result(tmp_path / "t.json")
    (tmp_path / "o.json").write_text('{"schema": "other"}')
    with pytest.raises(ResultError, match="o.json: schema is 'other'"):
        load_result(tmp_path / "o.json")


def test_percentiles_interpolate_like_numpy() -> None:
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 50) == 2.5 and percentile(xs, 95) == pytest.approx(3.85)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None
    s = summarize("ttft", "ms", [0.001, 0.003], scale=1000)
    assert s == {
        "mean_ttft_ms": 2.0,
        "median_ttft_ms": 2.0,
        "std_ttft_ms": 1.0,
        "p95_ttft_ms": 2.9,
        "p99_ttft_ms": 2.98,
    }


def test_the_client_reports_its_own_cpu_share(doc: dict[str, Any]) -> None:
    assert doc["client_cpu_seconds"] >= 0
    assert doc["client_cpu_utilization"] == pytest.approx(doc["client_cpu_seconds"] / doc["duration"], abs=1e-3)


@pytest.mark.parametrize(
    "cpu, duration, noted", [(0.4, 1.0, False), (0.6, 1.0, True), (None, 1.0, False), (1.0, 0.0, False)]
)
def test_a_busy_client_is_noted(cpu: float | None, duration: float, noted: bool) -> None:
    note = client_busy_note(cpu, duration)
    assert (note is not None) == noted
    if noted:
        assert "60% of one core" in note


def test_the_host_records_the_cpus_model_and_vector_extensions():
    from kimidflash.hostinfo import cpu_kind

    info = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
    assert cpu_kind(info) == {"cpu_model": "AMD EPYC 7B13", "cpu_flags": ["avx2", "avx512f", "avx512_bf16"]}
    assert cpu_kind("") == {"cpu_model": None, "cpu_flags": []}
