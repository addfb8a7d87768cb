"""The sweep against scripted servers: grid expansion and validation, the run
folder (resume, grid-change refusal, --new), failure isolation, Ctrl-C, best.env
and the advisor inside a sweep (the summary's maths alone: test_sweep_summary.py).

Each point is "served" by a FakeServer whose speed and acceptance follow the
point's k (`Fleet`, and the `base` and `fleet` fixtures, in conftest.py: test_sweep_schedule.py
uses them too), swapped in for the recipe's serve path; the slow test in test_sweep_slow.py runs
the real one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from kimidflash.background import serving_process, sigterm_as_interrupt
from kimidflash.cli import main as cli_main
from kimidflash.config import load_config
from kimidflash.errors import SweepError
from kimidflash.sweep.grid import Grid, add_client, add_server, cases, points, read_grid_file


def sweep(base: Path, out: Path, *extra: str, ks: str = "1,2,4") -> int:
    return cli_main(
        [
            "sweep",
            str(base),
            "--grid",
            f"NUM_SPECULATIVE_TOKENS={ks}",
            "--concurrency",
            "1",
            "2",
            "--sessions",
            "2",
            "--max-tokens",
            "16",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--out",
            str(out),
            *extra,
        ]
    )


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


# --- grid -------------------------------------------------------------------------------


def test_points_baseline_first_then_largest_k_and_one_baseline_per_other_key(base):
    g = Grid()
    add_server(g, "NUM_SPECULATIVE_TOKENS", [1, 3, 2], "t")
    add_server(g, "MAX_NUM_SEQS", [4, 8], "t")
    pts = points(g, base)
    assert [p.id for p in pts] == [
        "none_seqs4",
        "k3_seqs4",
        "k1_seqs4",
        "k2_seqs4",
        "none_seqs8",
        "k3_seqs8",
        "k1_seqs8",
        "k2_seqs8",
    ]
    assert {p.baseline_id for p in pts if "seqs8" in p.id} == {"none_seqs8"}
    assert pts[0].sets == ["MAX_NUM_SEQS=4", "SPECULATIVE_METHOD=none"]
    assert pts[1].family == "dflash_seqs4" and pts[1].k == 3 and not pts[0].speculative


def test_points_that_render_the_same_server_run_once(base):
    g = Grid()
    add_server(g, "SPECULATIVE_METHOD", ["none", "dflash"], "t")
    add_server(g, "NUM_SPECULATIVE_TOKENS", [1, 2], "t")
    assert [p.id for p in points(g, base)] == ["none", "specdflash_k2", "specdflash_k1"]


def test_cases_are_named_by_what_varies_and_unfillable_slots_are_refused():
    g = Grid()
    add_client(g, "concurrency", [1, 4], "t")
    add_client(g, "max_tokens", [32, 64], "t")
    add_client(g, "sessions", [4], "t")
    assert [c.id for c in cases(g)] == ["c1-m32", "c1-m64", "c4-m32", "c4-m64"]
    add_client(g, "sessions", [2], "t")
    with pytest.raises(SweepError, match="concurrency=4 sessions=2"):
        cases(g)


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--grid", "NUM_SPECULATIVE_TOKENS=1,0"], "point k0 (NUM_SPECULATIVE_TOKENS=0) is invalid"),
        (["--grid", "NUM_SPECULATIV_TOKENS=1"], "did you mean NUM_SPECULATIVE_TOKENS"),
        (["--grid", "PORT=1,2"], "PORT cannot be swept"),
        (["--grid", "MAX_NUM_SEQS=4,4"], "repeats a value"),
        (["--grid", "MAX_NUM_SEQS"], "expected KEY=V1,V2"),
        (["--concurrency", "0"], "concurrency must be at least 1"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--max-p95-latency", "0"], "--max-p95-latency must be positive"),
        (["--request-timeout", "0"], "--request-timeout 0.0: must be positive"),
        (["--warmup", "-1"], "--warmup -1: must be 0 or more"),
    ],
)
def test_a_bad_point_or_setting_refuses_the_whole_sweep_before_anything_starts(
    base, tmp_path, fleet, capsys, args, culprit
):
    out = tmp_path / "run"
    assert cli_main(["sweep", str(base), "--out", str(out), *args]) == 2
    assert culprit in capsys.readouterr().err
    assert fleet.served == [] and not out.exists()


def test_grid_file_and_its_errors(tmp_path, base):
    f = tmp_path / "grid.toml"
    f.write_text(
        "[server]\nNUM_SPECULATIVE_TOKENS = [1, 2]\nENABLE_PREFIX_CACHING = true\n"
        "[client]\nconcurrency = [1, 4]\nmax_tokens = 32\n"
    )
    g = read_grid_file(f)
    assert g.server == {"NUM_SPECULATIVE_TOKENS": ["1", "2"], "ENABLE_PREFIX_CACHING": ["true"]}
    assert g.client == {"concurrency": [1, 4], "max_tokens": [32]}
    for text, msg in (
        ("[server\n", "not TOML"),
        ("[clients]\n", "unknown table"),
        ("[client]\nthreads = 2\n", "unknown client setting 'threads'"),
        ("[client]\nmax_tokens = 'many'\n", "not a whole number"),
    ):
        f.write_text(text)
        with pytest.raises(SweepError, match=msg):
            read_grid_file(f)


def test_dry_run_lists_points_and_commands_and_writes_nothing(base, tmp_path, fleet, capsys):
    out = tmp_path / "run"
    assert sweep(base, out, "--dry-run") == 0
    text = capsys.readouterr().out
    assert "[none] no speculation (baseline)" in text and "[k4] NUM_SPECULATIVE_TOKENS=4 (vs none)" in text
    assert "--set NUM_SPECULATIVE_TOKENS=4" in text and '"num_speculative_tokens":4' in text
    assert "[c2] bench run --concurrency 2 --sessions 2" in text
    assert fleet.served == [] and not out.exists()


# --- a whole sweep against the fleet --------------------------------------------------------


def test_sweep_measures_every_point_predicts_before_the_other_k_and_writes_best_env(base, tmp_path, fleet, capsys):
    out = tmp_path / "run"
    assert sweep(base, out) == 0
    assert fleet.served == [
        "SPECULATIVE_METHOD=none",
        "NUM_SPECULATIVE_TOKENS=4",
        "NUM_SPECULATIVE_TOKENS=1",
        "NUM_SPECULATIVE_TOKENS=2",
    ]
    for pid in ("none", "k1", "k2", "k4"):
        for c in ("c1", "c2"):
            doc = json.loads((out / "points" / pid / f"{c}-r1.json").read_text())
            assert doc["config"]["recipe_overrides"] and doc["completed"] == 2
    kinds = [(e["event"], e.get("point")) for e in events(out)]
    assert kinds.index(("predicted", None)) < kinds.index(("point_start", "k1"))  # predicted before k1 ran
    advice = json.loads((out / "advice" / "dflash-c1.json").read_text())
    assert advice["from_point"] == "k4" and advice["profile"] == [1.0, 1.0, 0.0, 0.0]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["rows"]) == 8 and summary["failed"] == {} and summary["incomplete"] == []
    cmp = next(a for a in summary["advisor"] if a["case"] == "c1")
    assert [b["k"] for b in cmp["by_k"]] == [1, 2, 4]
    assert all(b["predicted_speedup"] and b["measured_speedup"] for b in cmp["by_k"])
    assert "measured_best" in cmp and "agree" in cmp and "refit" in cmp
    env = (out / "best.env").read_text()
    assert "INCLUDE=../base.env" in env
    b = summary["best"]
    point_sets = next(p for p in summary["rows"] if p["point"] == b["point"])["overrides"]
    # the best static point's overrides: in best.env, or in best-static.env when a schedule won (timed fakes)
    static = (out / ("best-static.env" if summary.get("schedule") else "best.env")).read_text()
    assert all(s in static.splitlines() for s in point_sets)
    cfg = load_config(out / "best.env")  # serve.sh takes it
    assert cfg.served_model_name == fleet.model
    assert (out / "charts" / "throughput.png").stat().st_size > 0 and (out / "charts" / "pareto.png").is_file()
    md = (out / "summary.md").read_text()
    assert "| point | case | output tok/s" in md and "predicted speedup | measured speedup | error" in md
    said = capsys.readouterr().out
    if summary.get("schedule"):  # the fake steps are timed, so which k wins at c1 varies between runs
        assert f"best: the draft schedule {summary['schedule']['schedule']}," in said
        assert f"the best static point, {b['point']} at {b['case']}, to best-static.env" in said
        assert (out / "best-static.env").is_file()
    else:
        assert f"best: {b['point']} at {b['case']}" in said


def test_rerunning_resumes_and_more_repeats_extend(base, tmp_path, fleet):
    out = tmp_path / "run"
    assert sweep(base, out) == 0
    fleet.served.clear()
    assert sweep(base, out) == 0
    assert fleet.served == []  # everything was on disk
    assert events(out)[-2]["event"] == "sweep_start" and events(out)[-2]["resumed"] is True
    assert sweep(base, out, "--repeats", "2") == 0  # --repeats is not part of the identity
    assert len(fleet.served) == 4 and (out / "points" / "k2" / "c2-r2.json").is_file()


def test_changed_grid_or_base_config_is_refused_unless_new(base, tmp_path, fleet, capsys):
    out = tmp_path / "run"
    assert sweep(base, out) == 0
    assert sweep(base, out, ks="1,2") == 2
    assert "differs in: grid, points" in capsys.readouterr().err
    base.write_text(base.read_text() + "MAX_NUM_SEQS=4\n")
    assert sweep(base, out) == 2
    assert "base_config_sha256" in capsys.readouterr().err
    assert sweep(base, out, "--new") == 0
    old = [p for p in out.iterdir() if p.name.startswith("superseded-")]
    assert (
        len(old) == 1 and (old[0] / "manifest.json").is_file() and (old[0] / "points" / "k4" / "c1-r1.json").is_file()
    )


def test_a_folder_of_something_else_is_refused(base, tmp_path, fleet, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert sweep(base, out) == 2
    assert "not empty and holds no sweep manifest" in capsys.readouterr().err


def test_a_failed_point_is_recorded_with_its_log_and_the_sweep_goes_on(base, tmp_path, fleet):
    out = tmp_path / "run"
    fleet.refuse.add("NUM_SPECULATIVE_TOKENS=1")
    fleet.die.add("NUM_SPECULATIVE_TOKENS=2")
    assert sweep(base, out) == 1
    f1 = json.loads((out / "points" / "k1" / "failure.json").read_text())
    assert f1["error"].startswith("serve ") and "ERROR RuntimeError: out of KV cache blocks" in f1["last_log_lines"]
    f2 = json.loads((out / "points" / "k2" / "failure.json").read_text())
    assert "benchmark c1 repeat 1" in f2["error"]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["failed"]) == {"k1", "k2"} and "k1 c1" in summary["incomplete"]
    assert {r["point"] for r in summary["rows"]} == {"none", "k4"}
    assert "Point **k1** failed" in (out / "summary.md").read_text()
    # Fixed: re-running retries only what failed, and the failure records go.
    fleet.refuse.clear()
    fleet.die.clear()
    fleet.served.clear()
    assert sweep(base, out) == 0
    assert fleet.served == ["NUM_SPECULATIVE_TOKENS=1", "NUM_SPECULATIVE_TOKENS=2"]
    assert not (out / "points" / "k1" / "failure.json").exists()


def test_ctrl_c_keeps_finished_results_and_the_same_command_resumes(base, tmp_path, fleet, capsys):
    out = tmp_path / "run"
    fleet.interrupt.add("NUM_SPECULATIVE_TOKENS=1")
    assert sweep(base, out) == 130
    assert "Re-run the same command to resume" in capsys.readouterr().err
    assert events(out)[-1]["event"] == "interrupted"
    done = sorted(p.relative_to(out).as_posix() for p in out.glob("points/*/*.json"))
    assert done == ["points/k4/c1-r1.json", "points/k4/c2-r1.json", "points/none/c1-r1.json", "points/none/c2-r1.json"]
    assert not list(out.rglob("*.tmp"))  # nothing half-written
    fleet.interrupt.clear()
    fleet.served.clear()
    assert sweep(base, out) == 0
    assert fleet.served == ["NUM_SPECULATIVE_TOKENS=1", "NUM_SPECULATIVE_TOKENS=2"]


def test_sigterm_ends_a_sweep_like_ctrl_c_and_restores_the_handler(base, tmp_path, fleet):
    out = tmp_path / "run"
    fleet.terminate.add("NUM_SPECULATIVE_TOKENS=1")
    before = signal.getsignal(signal.SIGTERM)
    assert sweep(base, out) == 130
    assert events(out)[-1]["event"] == "interrupted" and (out / "points" / "k4" / "c2-r1.json").is_file()
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_inside_asyncio_run_is_not_swallowed_by_a_task_that_survives_cancellation():
    async def stubborn() -> str:  # as the benchmark runner: a cancelled run still returns its result
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "finished anyway"
        return "slept"

    async def ctrl_c_then(coro):
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        return await coro

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        asyncio.run(ctrl_c_then(stubborn()))
    assert signal.getsignal(signal.SIGINT) is before


def test_a_relative_out_folder_is_the_callers_not_the_repository_roots(tmp_path, monkeypatch):
    """serve runs from the repository root, so a sweep given `--out runs/x` from anywhere else once
    had every point fail: serve opened its log under the root instead."""
    fake_serve = [
        sys.executable,
        "-c",
        "import sys; open(sys.argv[sys.argv.index('--log-file') + 1], 'a')"
        ".write(sys.argv[1]); print('serve: ready in 0.1s', flush=True)",
    ]
    monkeypatch.chdir(tmp_path)
    with serving_process("mine.env", [], Path("runs/x/server.log"), timeout=30, cmd=fake_serve) as (proc, _):
        proc.wait(30)
    assert (tmp_path / "runs/x/server.log").read_text() == str(tmp_path / "mine.env")


def test_no_point_within_the_limits_leaves_no_best_env(base, tmp_path, fleet, capsys):
    out = tmp_path / "run"
    assert sweep(base, out) == 0
    assert (out / "best.env").is_file()
    assert sweep(base, out, "--min-user-tps", "1e9") == 0
    assert "no point meets the limits (per-user tok/s >= 1e+09)" in capsys.readouterr().out
    assert not (out / "best.env").exists()
