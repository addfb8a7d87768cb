"""The seed-compatible command line, run as users run it: a subprocess of
payload/benchmark_multi_turn.py against the in-process server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimidflash.bench import validate_result
from kimidflash.paths import REPO_ROOT

from ..support.fakeserver import FakeServer, Plan

SCRIPT = REPO_ROOT / "payload" / "benchmark_multi_turn.py"


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer(Plan(chunks=(1, 2, 3)), spec_tokens=2).start()
    yield s
    s.stop()


RUN = "benchmark_multi_turn.py run: "  # the dispatcher's prefix for the default command's errors


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    # cwd=/ proves the script finds its package from its own location, not from the cwd.
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd="/"
    )


def test_seed_command_line_writes_a_valid_result(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.json"
    r = cli(
        "--base-url",
        server.base_url,
        "--model",
        server.model,
        "--sessions",
        "4",
        "--turns-per-session",
        "1",
        "--max-tokens",
        "512",
        "--warmup",
        "1",
        "--output",
        str(out),
        "--label",
        "dflash st=2",
        "--api-key",
        "hunter2",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert validate_result(doc) == []
    assert doc["label"] == "dflash st=2" and doc["completed"] == 4 and doc["max_concurrency"] == 4
    assert doc["config"]["max_tokens"] == 512 and doc["config"]["turns_per_session"] == 1
    assert "hunter2" not in out.read_text()
    assert "--api-key '***'" in doc["provenance"]["command"]
    assert "output throughput" in r.stderr and f"result: {out}" in r.stderr
    assert not list(out.parent.glob(".*tmp"))  # the atomic write left no temp file


def test_sigint_writes_a_partial_result_and_exits_130(server: FakeServer, tmp_path: Path) -> None:
    server._plan = Plan(chunks=(1,) * 100, delay=0.05)
    out = tmp_path / "partial.json"
    p = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--base-url",
            server.base_url,
            "--model",
            server.model,
            "--sessions",
            "2",
            "--warmup",
            "0",
            "--output",
            str(out),
            "-q",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 20
        while server.counters.generation_tokens < 4 and time.monotonic() < end and p.poll() is None:
            time.sleep(0.01)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    doc = json.loads(out.read_text())
    assert validate_result(doc) == []
    assert doc["partial"] is True and doc["partial_reason"] == "interrupted by SIGINT"
    assert doc["errors"] == {"cancelled": 2}
    assert "(partial)" in err


def test_dying_server_exits_3_with_a_partial_result(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "dead.json"

    # the server answers the first request, then drops the second and dies
    def die_after_second(i: int, body: dict) -> Plan:
        if i >= 1:
            server.die()
        return Plan(chunks=(1, 1))

    server._plan = die_after_second
    r = cli(
        "--base-url",
        server.base_url,
        "--model",
        server.model,
        "--sessions",
        "1",
        "--turns-per-session",
        "4",
        "--warmup",
        "0",
        "--output",
        str(out),
        "-q",
    )
    assert r.returncode == 3, r.stderr
    doc = json.loads(out.read_text())
    assert doc["partial"] and validate_result(doc) == []
    assert doc["completed"] == 1 and doc["failed"] == 1 and doc["not_started"] == 2


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--base-url", "127.0.0.1:1/v1", "--model", "m"], "--base-url must be an http(s) URL"),
        (["--base-url", "http://127.0.0.1:1/v1", "--model", "m"], "cannot reach http://127.0.0.1:1/v1"),
        (
            ["--base-url", "http://127.0.0.1:1/v1", "--model", "m", "--prompts", "/no/p.jsonl"],
            "prompts file not found: /no/p.jsonl",
        ),
        (["--model", "m"], "--base-url is required"),
        (["--base-url", "http://127.0.0.1:1/v1", "--sessions", "0"], "--sessions must be at least 1"),
    ],
)
def test_bad_input_is_one_line_naming_the_culprit(args: list[str], culprit: str) -> None:
    r = cli(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(RUN) and culprit in lines[0], r.stderr


def test_unknown_model_names_the_served_ones(server: FakeServer, tmp_path: Path) -> None:
    r = cli("--base-url", server.base_url, "--model", "kimi", "--output", str(tmp_path / "x.json"))
    assert r.returncode == 2
    assert r.stderr.strip() == f"{RUN}model 'kimi' is not served at {server.base_url}; it serves: fake-model"
    assert not (tmp_path / "x.json").exists()


def test_validate_subcommand(server: FakeServer, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    assert cli("--base-url", server.base_url, "--sessions", "1", "--output", str(good), "-q").returncode == 0
    doc = json.loads(good.read_text())
    doc["completed"] += 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = cli("validate", str(good), str(bad), str(tmp_path / "missing.json"))
    assert r.returncode == 2
    assert f"{good}: valid" in r.stdout
    assert f"{bad}: completed=2 but 1 successful requests listed" in r.stderr
    assert f"result file not found: {tmp_path / 'missing.json'}" in r.stderr


def test_progress_bar_counts_measured_requests(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    from kimidflash.bench import BenchConfig, run_benchmark

    doc = run_benchmark(
        BenchConfig(base_url=server.base_url, sessions=3, warmup=1, progress=True, metrics_settle_timeout=0.5)
    )
    assert doc["completed"] == 3
    err = capsys.readouterr().err
    assert "requests (errors 0)" in err and "3/3" in err  # warm-up not counted in the bar


def test_a_run_where_every_request_failed_is_not_a_measurement(server: FakeServer, tmp_path: Path) -> None:
    server._plan = Plan(fault="http_500")
    out = tmp_path / "failed.json"
    r = cli(
        "--base-url", server.base_url, "--model", server.model, "--sessions", "2", "--warmup", "0", "--output", str(out)
    )
    assert r.returncode == 3, r.stderr
    assert "no request completed: http_500" in r.stderr
    assert "0.00 / 0.00" not in r.stderr
    doc = json.loads(out.read_text())  # still written: a sweep records it as a failed point
    assert doc["completed"] == 0 and doc["failed"] == 2
    for key in ("output_throughput", "request_throughput", "total_token_throughput", "mean_e2el_ms", "mean_ttft_ms"):
        assert doc[key] is None, key
    assert validate_result(doc) == []
    v = cli("validate", str(out))
    assert v.returncode == 0 and f"{out}: valid (no request completed)" in v.stdout


def test_an_unwritable_output_is_refused_before_the_first_request(server: FakeServer, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "r.json"  # its "directory" is a file: it can never be written
    r = cli(
        "--base-url", server.base_url, "--model", server.model, "--sessions", "1", "--warmup", "0", "--output", str(out)
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(RUN) and str(out) in lines[0], r.stderr
    assert server.bodies == []  # nothing was sent


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--warmup-max-tokens", "0"], "--warmup-max-tokens must be at least 1"),
        (["--max-connection-errors", "-1"], "--max-connection-errors must be at least 1"),
    ],
)
def test_nonsense_limits_are_refused(server: FakeServer, args: list[str], culprit: str) -> None:
    r = cli("--base-url", server.base_url, "--model", server.model, "--sessions", "1", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(RUN) and culprit in lines[0], r.stderr
    assert server.bodies == []
