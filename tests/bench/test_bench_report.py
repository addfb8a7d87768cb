"""`compare` renders the seed's three tables and the charts from result files:
ours (produced here against the in-process server) and the seed's published ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kimidflash.bench import BenchConfig, run_benchmark, write_result
from kimidflash.bench.report import compare
from kimidflash.errors import ReportError
from kimidflash.paths import REPO_ROOT

from ..support.fakeserver import FakeServer, Plan

SEED = REPO_ROOT / "benchmarks" / "seed"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A baseline (1 token per chunk) and a speculative series (k=2), each at concurrency 1 and 2."""
    out = tmp_path_factory.mktemp("results")
    files: dict[str, Any] = {}
    for name, spec, plan in (
        ("base", 0, Plan(chunks=(1,) * 12, delay=0.004)),
        ("dflash", 2, Plan(chunks=(1, 3, 2, 3, 3), delay=0.004)),
    ):
        with FakeServer(plan, spec_tokens=spec) as s:
            for c in (1, 2):
                doc = run_benchmark(
                    BenchConfig(
                        base_url=s.base_url,
                        sessions=c,
                        turns_per_session=2,
                        warmup=0,
                        label="Autoregressive" if not spec else "DFlash k=2",
                        metrics_settle_timeout=0.5,
                    )
                )
                path = out / f"{name}-c{c}.json"
                write_result(path, doc)
                files[f"{name}{c}"] = (path, doc)
    return files


def cells(table: Any) -> dict[str, list[str]]:
    return {row[0]: row for row in table.rows}


def test_head_to_head_uses_same_concurrency_speedups(results: dict[str, Any], tmp_path: Path) -> None:
    paths = [p for p, _ in results.values()]
    rep = compare(paths, markdown=tmp_path / "r.md", charts=tmp_path / "charts", terminal=False)
    h2h = rep.tables[0]
    assert h2h.headers == ["Concurrent users", "Autoregressive (baseline)", "DFlash k=2", "Speedup"]
    rows = cells(h2h)
    for c in (1, 2):
        base, spec = results[f"base{c}"][1], results[f"dflash{c}"][1]
        assert rows[f"{c} users"][1] == f"{base['output_throughput']:,.1f} tok/s"
        assert rows[f"{c} users"][2] == f"{spec['output_throughput']:,.1f} tok/s"
        assert rows[f"{c} users"][3] == f"{spec['output_throughput'] / base['output_throughput']:.2f}x"
    assert "peak" in rows


def test_per_user_latency_and_acceptance_tables(results: dict[str, Any], tmp_path: Path) -> None:
    rep = compare([p for p, _ in results.values()], terminal=False)
    lat = rep.tables[1]
    assert lat.headers == ["Series", "Concurrent users", "Mean latency", "P95 latency", "Per-user tok/s"]
    first = lat.rows[0]
    d = results["dflash1"][1]
    assert first[:2] == ["DFlash k=2", "1"]  # the speculative series first, as in the seed
    assert first[2] == f"{d['mean_e2el_ms'] / 1000:.2f}s" and first[3] == f"{d['p95_e2el_ms'] / 1000:.2f}s"
    assert first[4] == f"{d['mean_per_user_output_throughput']:.1f}"
    acc = rep.tables[2]
    assert acc.headers[:4] == ["Series", "Spec tokens", "Pos 0", "Pos 1"]
    (row,) = acc.rows  # the baseline has no acceptance row
    # every draft step after the first chunk: chunks 3,2,3,3 accept 2,1,2,2 of k=2
    drafts = 4
    assert row[1] == "2"
    assert row[2] == f"{4 / drafts * 100:.1f}%" and row[3] == f"{3 / drafts * 100:.1f}%"
    assert row[4] == f"{7 / 8 * 100:.1f}%" and row[5] == f"{1 + 7 / 4:.2f}"
    assert row[6].startswith(("+", "-")) and "@1" in row[6] and "@2" in row[6]


def test_markdown_and_charts_are_written(results: dict[str, Any], tmp_path: Path) -> None:
    md = tmp_path / "out" / "report.md"
    rep = compare([p for p, _ in results.values()], markdown=md, charts=tmp_path / "out" / "charts", terminal=False)
    text = md.read_text()
    assert text == rep.markdown
    assert "### Head-to-head" in text and "### Per-user latency" in text and "### Per-position acceptance" in text
    assert "| Concurrent users | Autoregressive (baseline) | DFlash k=2 | Speedup |" in text
    names = sorted(p.name for p in rep.charts)
    assert names == ["acceptance_by_position.png", "latency_vs_concurrency.png", "throughput_vs_concurrency.png"]
    for p in rep.charts:
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 5000
        assert f"](charts/{p.name})" in text
    assert "ours, series 'DFlash k=2'" in text  # provenance of every input is listed
    made_in = str(next(iter(results.values()))[0].parent)
    assert made_in not in text and "`$TMPDIR/" in text  # as portable(): never this machine's layout


def test_the_seed_tables_are_reproduced_from_its_published_figures(tmp_path: Path) -> None:
    rep = compare([SEED / "seed-mi300x-dflash-vs-autoregressive.json"], charts=tmp_path, terminal=False)
    h2h = cells(rep.tables[0])
    assert h2h["8 users"][1:] == ["90.4 tok/s", "127.1 tok/s", "1.41x"]
    assert h2h["12 users"][1:] == ["125.1 tok/s", "192.8 tok/s", "1.54x"]
    assert h2h["32 users"][1:] == ["—", "507.6 tok/s", "—"]
    lat = [r[1:] for r in rep.tables[1].rows]
    assert lat == [
        ["8", "31.0s", "31.3s", "15.9"],
        ["16", "30.8s", "31.1s", "15.7"],
        ["24", "30.0s", "30.4s", "15.8"],
        ["32", "30.7s", "31.0s", "15.9"],
    ]
    st2, st8 = rep.tables[2].rows
    assert st2[1:5] == ["2", "64.0%", "34.0%", "—"] and st2[-3:] == ["49.0%", "—", "+40% throughput"]
    assert st8[2:10] == ["64.0%", "34.0%", "18.0%", "9.0%", "<3%", "<3%", "<3%", "<3%"]
    assert "not by us" in rep.markdown
    assert len(rep.charts) == 3


def test_seed_files_are_marked_as_not_ours() -> None:
    for f in SEED.glob("*.json"):
        doc = json.loads(f.read_text())
        assert doc["measured_by_us"] is False
        assert "measured by its authors on 8x MI300X, not by us" in doc["warning"]
        assert doc["conditions"]


def test_compare_refuses_bad_inputs(results: dict[str, Any], tmp_path: Path) -> None:
    path = results["base1"][0]
    with pytest.raises(ReportError, match="--baseline 'nope' is not a series"):
        compare([path], baseline="nope", terminal=False)
    other = tmp_path / "other.json"
    other.write_text('{"schema": "something-else"}')
    with pytest.raises(ReportError, match="other.json: not a benchmark result"):
        compare([other], terminal=False)
    broken = tmp_path / "broken.json"
    doc = json.loads(Path(path).read_text())
    doc["completed"] = 99
    broken.write_text(json.dumps(doc))
    with pytest.raises(ReportError, match="broken.json: completed=99"):
        compare([broken], terminal=False)


def test_compare_command_line(results: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kimidflash.bench.cli import main

    paths = [str(p) for p, _ in results.values()]
    assert main(["compare", *paths, "--markdown", str(tmp_path / "c.md")]) == 0
    out = capsys.readouterr().out
    assert "Head-to-head" in out and "Per-position acceptance" in out and "Sources" in out
    assert main(["compare", str(tmp_path / "missing.json")]) == 2
    assert "benchmark_multi_turn.py compare: result file not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    "source, md, extra",
    [
        ("seed-mi300x-dflash-vs-autoregressive.json", "compare-dflash-vs-autoregressive.md", ["--charts", "CHARTS"]),
        ("seed-mi300x-fp8kv.json", "compare-fp8kv.md", ["--baseline", "BF16 KV seqs=32 (seed)"]),
    ],
)
def test_committed_seed_reports_are_what_compare_renders(
    source: str, md: str, extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/seed/*.md are generated; regenerate with the command in benchmarks/seed/README.md."""
    from kimidflash.bench.cli import main

    monkeypatch.chdir(REPO_ROOT)
    out = tmp_path / "seed" / md
    args = [a.replace("CHARTS", str(tmp_path / "seed" / "charts")) for a in extra]
    assert main(["compare", f"benchmarks/seed/{source}", "--markdown", str(out), "-q", *args]) == 0
    assert out.read_text() == (SEED / md).read_text()
