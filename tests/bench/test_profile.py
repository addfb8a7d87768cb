"""`kimidflash profile`: py-spy's collapsed stacks read, shared out and tabled; bad input named."""

from __future__ import annotations

import json

import pytest

from kimidflash.bench import profile, profile_cli
from kimidflash.cli import main as cli_main
from kimidflash.errors import BenchError

RAW = (
    'process 11:"VLLM::EngineCore";process 12:"VLLM::Worker";run (vllm/v1/worker/gpu_model_runner.py:10);'
    "forward (vllm/model_executor/models/llama.py:5) 6\n"
    'process 11:"VLLM::EngineCore";process 12:"VLLM::Worker";run (vllm/v1/worker/gpu_model_runner.py:10);'
    "propose (vllm/v1/spec_decode/llm_base_proposer.py:567);forward (vllm/model_executor/models/llama.py:9) 2\n"
    'process 11:"VLLM::EngineCore";process 12:"VLLM::Worker";'
    "wait (/opt/venv/lib/python3.11/site-packages/vllm/distributed/shm_broadcast.py:3) 2\n"
)


def test_frames_lose_line_numbers_and_machine_prefixes():
    assert (
        profile.frame_key("forward (vllm/model_executor/models/llama.py:5)")
        == "forward (vllm/model_executor/models/llama.py)"
    )
    assert profile.frame_key("wait (/opt/venv/lib/python3.11/site-packages/vllm/x.py:3)") == "wait (vllm/x.py)"
    assert profile.frame_key("main (/home/me/project/run.py:7)") == "main (project/run.py)"
    assert profile.frame_key("<native>") == "<native>"


def test_shares_are_inclusive_and_count_a_recursive_function_once_per_sample():
    stacks = profile.read_collapsed(RAW)
    assert sum(stacks.values()) == 10
    assert not any(f.startswith("process ") for frames in stacks for f in frames)
    s = profile.shares(stacks)
    assert s["run (vllm/v1/worker/gpu_model_runner.py)"] == 0.8
    assert s["forward (vllm/model_executor/models/llama.py)"] == 0.8  # on the stack twice in 2 samples: once
    assert s["propose (vllm/v1/spec_decode/llm_base_proposer.py)"] == 0.2
    assert s["wait (vllm/distributed/shm_broadcast.py)"] == 0.2


def test_a_line_that_is_not_a_stack_is_named_an_empty_stack_counts_and_no_samples_is_an_error():
    with pytest.raises(BenchError, match="line 2 is not 'STACK COUNT'"):
        profile.read_collapsed("a;b 3\nnot a stack\n")
    with pytest.raises(BenchError, match="line 1 is not 'STACK COUNT'"):
        profile.read_collapsed("12\n")
    # a frame read while the process changed may hold a newline: the sample goes on in the next line
    torn = profile.read_collapsed("a;b 3\nc;garbled\nfrom . import x;d 2\n")
    assert torn == {("a", "b"): 3, ("c", "garbled\nfrom . import x", "d"): 2}
    # py-spy writes a sample it found no frames for as ' COUNT': it stays in the total
    assert profile.shares(profile.read_collapsed("a;b 3\n 1\n")) == {"a": 0.75, "b": 0.75, profile.NO_STACK: 0.25}
    with pytest.raises(BenchError, match="no samples"):
        profile.shares(profile.read_collapsed(""))


def test_the_table_puts_the_largest_change_first_and_hides_what_is_small_everywhere():
    variants = [
        {"label": "none", "shares": {"forward": 0.9, "idle": 0.005, "sample": 0.02}},
        {"label": "k0", "shares": {"forward": 0.88, "propose": 0.03, "idle": 0.004, "sample": 0.025}},
    ]
    rows = profile.table(variants)
    assert [r[0] for r in rows] == ["propose", "forward", "sample"]
    assert rows[0] == ["propose", "0.0%", "3.0%", "+3.0"]
    assert rows[1] == ["forward", "90.0%", "88.0%", "-2.0"]


def test_variants_are_checked_before_any_server_starts(tmp_path, monkeypatch, capsys):
    assert profile.parse_variant("k0:NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-8:0,DTYPE=float32") == (
        "k0",
        ["NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE=1-8:0", "DTYPE=float32"],
    )
    assert profile.parse_variant("none") == ("none", [])
    with pytest.raises(BenchError, match="'a b': the label"):
        profile.parse_variant("a b")
    started = []
    monkeypatch.setattr(profile_cli, "run", lambda *a: started.append(a))
    assert (
        cli_main(["profile", "configs/cpu-reference.env", "--variant", "x", "--variant", "x", "--out", str(tmp_path)])
        == 2
    )
    assert "--variant labels must differ" in capsys.readouterr().err
    assert cli_main(["profile", "configs/cpu-reference.env", "--variant", "x:NOEQUALS", "--out", str(tmp_path)]) == 2
    assert "NOEQUALS" in capsys.readouterr().err
    monkeypatch.setattr(profile.shutil, "which", lambda *a, **k: None)
    assert cli_main(["profile", "configs/cpu-reference.env", "--variant", "x", "--out", str(tmp_path)]) == 2
    assert "py-spy not found" in capsys.readouterr().err
    assert started == []


def test_a_server_without_a_vllm_process_is_named():
    import os

    with pytest.raises(
        BenchError, match=f"no VLLM::Worker or VLLM::EngineCore process under serve \\(pid {os.getpid()}\\)"
    ):
        profile.model_process(os.getpid())
    with pytest.raises(BenchError, match=f"no VLLM::EngineCore process under serve \\(pid {os.getpid()}\\)"):
        profile.model_process(os.getpid(), profile.PROCESSES["engine-core"][0])


def test_process_picks_the_engine_core_over_the_worker(monkeypatch):
    """`--process engine-core` samples the engine core even where a worker runs the model."""

    class Proc:
        def __init__(self, pid, title):
            self.pid, self.title = pid, title

        def cmdline(self):
            return [self.title]

        def children(self, recursive):
            return [Proc(11, "VLLM::EngineCore"), Proc(12, "VLLM::Worker")]

    monkeypatch.setattr(profile.psutil, "Process", lambda pid: Proc(pid, "serve"))
    assert profile.model_process(1) == (12, "VLLM::Worker")
    assert profile.model_process(1, profile.PROCESSES["engine-core"][0]) == (11, "VLLM::EngineCore")


def test_the_report_is_written_whole(tmp_path):
    doc = {
        "concurrency": 8,
        "variants": [
            {
                "label": "none",
                "overrides": ["SPECULATIVE_METHOD=none"],
                "process": "VLLM::Worker",
                "samples": 10,
                "output_tps_under_profiler": 50.0,
                "shares": {"forward": 0.9},
            },
            {
                "label": "k0",
                "overrides": [],
                "process": "VLLM::Worker",
                "samples": 12,
                "output_tps_under_profiler": 48.0,
                "shares": {"forward": 0.85, "propose": 0.05},
            },
        ],
    }
    text = profile.write_report(doc, tmp_path)
    assert (tmp_path / "profile.md").read_text() == text
    assert text.startswith("# Where the worker's time goes at 8 users")
    assert profile.write_report({**doc, "process": "engine-core"}, tmp_path).startswith(
        "# Where the engine core's time goes at 8 users"
    )
    assert "| propose | 0.0% | 5.0% | +5.0 |" in text
    assert "| k0 | (the config as it is) | VLLM::Worker | 12 | 48.0 |" in text


@pytest.mark.slow
def test_a_real_profile_samples_the_worker_and_finds_the_drafter_in_the_speculating_variant(tmp_path):
    """The tiny pair served twice (DFlash, then no speculation) under py-spy: the worker process is
    found and sampled, the target's forward is in both profiles, the drafter's proposal only in the
    speculating one, and nothing written names this machine's paths."""
    import os

    from kimidflash.paths import REPO_ROOT

    from ..support.helpers import CONFIGS

    out = tmp_path / "profile"
    assert (
        cli_main(
            [
                "profile",
                str(CONFIGS / "cpu-tiny.env"),
                "--variant",
                "dflash",
                "--variant",
                "none:SPECULATIVE_METHOD=none",
                "--concurrency",
                "4",
                "--sessions",
                "32",
                "--max-tokens",
                "128",
                "--warmup",
                "1",
                "--rate",
                "250",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads((out / "profile.json").read_text())
    dflash, none = doc["variants"]
    assert dflash["process"] == none["process"] == "VLLM::Worker"
    # A few seconds at 250 Hz. py-spy misses ticks when CI runs this beside other tests (175 of the
    # no-speculation variant's once at 64 tokens a reply), so replies are 128 tokens and the floor
    # only says the worker was sampled for seconds.
    assert min(dflash["samples"], none["samples"]) > 150
    forward = "GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py)"
    propose = "GPUModelRunner.propose_draft_token_ids (vllm/v1/worker/gpu_model_runner.py)"
    # The tiny pair's worker mostly waits on its queue: at 2 users the forward was 0.99% of 806 samples
    # without speculation on one CI run and none of 351 with DFlash on another (py-spy missing ticks
    # under load). At 4 users over 16 sessions, alone on CPU-AMX, DFlash's forward was 1.35% and its
    # proposal 0.63% of 1,111 samples; 32 sessions double the samples a loaded CI machine keeps.
    # Presence is the check, and a wrong process (the API server) has none.
    assert dflash["shares"].get(forward, 0) > 0 and none["shares"].get(forward, 0) > 0
    assert dflash["shares"].get(propose, 0) > 0 and propose not in none["shares"]
    assert "| dflash | (the config as it is) | VLLM::Worker |" in (out / "profile.md").read_text()
    for f in ("profile.json", "profile.md", "dflash-stacks.txt", "none-stacks.txt"):
        text = (out / f).read_text()
        assert os.path.expanduser("~") + "/" not in text and str(REPO_ROOT) not in text, f
