"""The server's per-process CPU time in the window (`server_cpu`), from a real process tree."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kimidflash.bench import BenchConfig, run_benchmark, validate_result
from kimidflash.bench.hostcpu import role
from kimidflash.errors import BenchError

from ..support.fakeserver import FakeServer, Plan

BURN = "import time\nt = time.time()\nwhile time.time() - t < 60: pass\n"


@pytest.fixture
def tree() -> Iterator[subprocess.Popen]:
    """A launcher (bash) whose child burns one core under vLLM's engine-core title, as
    `kimidflash serve` -> vLLM's processes are laid out."""
    proc = subprocess.Popen(
        ["bash", "-c", f'exec -a "VLLM::EngineCore" {sys.executable} -c "$0" & wait', BURN], start_new_session=True
    )
    yield proc
    subprocess.run(["pkill", "-P", str(proc.pid)], check=False)
    proc.kill()
    proc.wait()


def run(pid: int | None) -> dict[str, Any]:
    with FakeServer(Plan(chunks=(1, 2, 2), delay=0.05)) as s:
        return run_benchmark(
            BenchConfig(
                base_url=s.base_url,
                sessions=4,
                turns_per_session=2,
                warmup=1,
                metrics_settle_timeout=0.5,
                server_pid=pid,
            )
        )


def test_each_process_of_the_tree_is_charged_its_own_time(tree: subprocess.Popen) -> None:
    doc = run(tree.pid)
    assert validate_result(doc) == []
    cpu = doc["server_cpu"]
    rows = {r["process"]: r for r in cpu["processes"]}
    assert set(rows) == {"bash", "VLLM::EngineCore"}, rows
    burner, launcher = rows["VLLM::EngineCore"], rows["bash"]
    # a busy loop: about one core over the window alone, a third or more of one on a loaded two-core
    # host (CI runs the fast tier beside slow tests)
    assert burner["cpu_seconds"] > 0.2 * doc["duration"]
    assert burner["utilization"] == pytest.approx(burner["cpu_seconds"] / doc["duration"], abs=0.01)
    assert burner["ms_per_output_token"] == pytest.approx(
        1000 * burner["cpu_seconds"] / doc["total_output_tokens"], rel=0.01
    )
    assert launcher["cpu_seconds"] < 0.1 * burner["cpu_seconds"]  # bash only waits
    assert cpu["processes"][0]["process"] == "VLLM::EngineCore"  # busiest first
    assert cpu["total_cpu_seconds"] == pytest.approx(burner["cpu_seconds"] + launcher["cpu_seconds"], abs=0.002)
    assert 0 < cpu["host_busy_fraction"] <= 1


def test_without_a_pid_there_is_no_server_cpu() -> None:
    assert run(None)["server_cpu"] is None


def test_a_pid_that_is_not_running_is_refused_by_name() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(BenchError, match=f"--server-pid {gone.pid}: no such process"):
        BenchConfig(base_url="http://127.0.0.1:1/v1", server_pid=gone.pid).checked()


@pytest.mark.parametrize(
    "cmdline, name, expected",
    [
        (["VLLM::EngineCore"], "python3", "VLLM::EngineCore"),
        (["VLLM::Worker_TP0 extra"], "python3", "VLLM::Worker_TP0"),
        (["/venv/bin/python3", "/venv/bin/vllm", "serve", "/models/t"], "python3", "api server"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], "python3", "api server"),
        (["python3", "-m", "kimidflash", "serve", "configs/cpu-reference.env"], "python3", "launcher"),
        (["bash", "./serve.sh", "configs/x.env"], "bash", "launcher"),
        (["/opt/kimidflash/launchers/kimi26-vllm-dflash.sh", "--", "vllm"], "bash", "launcher"),
        (["/tmp/kimidflash-ci.x/venv/bin/python", "-c", "pass"], "python", "python"),  # a path says nothing
        (["bash", "-c", "exec /tmp/kimidflash-ci.x/venv/bin/vllm serve"], "bash", "bash"),
        (["sleep", "60"], "sleep", "sleep"),
        (["/repo/serve.sh"], "serve.sh", "launcher"),
        ([], "zombie", "zombie"),
    ],
)
def test_roles_name_vllms_processes(cmdline: list[str], name: str, expected: str) -> None:
    assert role(cmdline, name) == expected
