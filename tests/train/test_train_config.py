"""Training config, data records and the CLI's bad-input lines (fast tier)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kimidflash.train import config as tcfg
from kimidflash.train.data import (
    DataError,
    is_heldout,
    load_prompts,
    make_record,
    read_records,
    synthetic_combos,
    synthetic_prompts,
)

from ..support.helpers import CONFIGS, ROOT


def write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def test_shipped_training_configs_load_and_match_their_drafter_shapes():
    for name in ("train-cpu-reference.json", "train-overfit-gate.json", "train-kimi-k2.6.json"):
        cfg = tcfg.load(CONFIGS / name)
        shape = tcfg.drafter_shape(cfg)
        assert cfg.train.block_size >= (cfg.export.block_size or shape["block_size"])
        assert max(cfg.eval.k) + 1 <= cfg.train.block_size
        assert max(shape["dflash_config"]["target_layer_ids"]) < shape["num_target_layers"] - 1


def test_unknown_key_is_named(tmp_path):
    p = write(tmp_path, "t.json", {"drafter_config": "x.json", "train": {"stepz": 3}})
    with pytest.raises(tcfg.TrainConfigError, match=r"t.json.train: unknown key 'stepz'"):
        tcfg.load(p)


def test_last_target_layer_is_refused(tmp_path):
    shape = json.loads((CONFIGS / "smollm2-dflash-draft.json").read_text())
    shape["dflash_config"]["target_layer_ids"] = [1, 29]
    d = write(tmp_path, "d.json", shape)
    cfg = tcfg.load(write(tmp_path, "t.json", {"drafter_config": str(d)}))
    with pytest.raises(tcfg.TrainConfigError, match="last layer"):
        tcfg.drafter_shape(cfg)


def test_set_overrides_parse_json_values():
    cfg = tcfg.load(CONFIGS / "train-cpu-reference.json", tcfg.parse_set(["train.steps=7", "eval.k=[3]"]))
    assert cfg.train.steps == 7 and cfg.eval.k == [3]
    with pytest.raises(tcfg.TrainConfigError, match="unknown key 'nope'"):
        tcfg.load(CONFIGS / "train-cpu-reference.json", {"train.nope": 1})


@pytest.mark.parametrize(
    "args,needle",
    [
        (["configs/missing.json"], "training config not found"),
        (["configs/train-cpu-reference.json", "bogus"], "unknown phase 'bogus'"),
        (["configs/train-cpu-reference.json", "train", "--run-dir", "/nonexistent/run"], "no manifest.json"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, needle):
    p = subprocess.run(
        [str(ROOT / "train-drafter.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "KIMIDFLASH_PYTHON": sys.executable},
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kimidflash train: ") and needle in lines[0]


def test_record_keeps_prompt_zero_response_one(tmp_path):
    r = make_record("a", "hi", [1, 2, 3], [7, 8], "stop")
    assert r.input_ids == [1, 2, 3, 7, 8] and r.loss_mask == [0, 0, 0, 1, 1] and r.n_response == 2
    bad = tmp_path / "r.jsonl"
    bad.write_text(json.dumps({**r.__dict__, "loss_mask": [0, 1]}) + "\n")
    with pytest.raises(DataError, match="r.jsonl:1: record a: input_ids and loss_mask differ"):
        read_records(bad)


def test_synthetic_prompts_are_distinct_and_seeded():
    a, b = synthetic_prompts(500, 0), synthetic_prompts(500, 0)
    assert a == b and len({p["prompt"] for p in a}) == 500
    assert synthetic_prompts(50, 1) != a[:50]


def test_prompt_sources_joined_by_plus_keep_their_order_and_refuse_an_id_twice(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"id": "a", "prompt": "first"}\n{"id": "b", "prompt": "second"}\n')
    got = load_prompts(f"{f}+synthetic:3", 0)
    assert got == load_prompts(str(f), 0) + synthetic_prompts(3, 0)
    assert load_prompts(f"synthetic:3 + {f}", 0) == synthetic_prompts(3, 0) + load_prompts(str(f), 0)
    with pytest.raises(DataError, match="id syn-0-00000 comes twice"):
        load_prompts("synthetic:2+synthetic:3", 0)
    with pytest.raises(DataError, match="prompts file not found"):
        load_prompts(f"synthetic:2+{tmp_path}/nope.jsonl", 0)


def test_a_larger_synthetic_set_only_appends_and_keeps_the_committed_data_valid():
    """The shipped regen data names its prompts by synthetic id: growing the template and
    subject sets must leave every one of them naming the same prompt."""
    every = synthetic_prompts(len(synthetic_combos(0)), 0)
    assert len({p["prompt"] for p in every}) == len(every) > 10_000
    assert every[:2880] == synthetic_prompts(2880, 0)
    with gzip.open(ROOT / "drafters/smollm2-135m-dflash-data/regen.jsonl.gz", "rt") as f:
        committed = [json.loads(line) for line in f]
    by_id = {p["id"]: p["prompt"] for p in every}
    assert committed and all(by_id[r["id"]] == r["prompt"] for r in committed)
    with pytest.raises(DataError, match=f"synthetic prompt set has {len(every)} prompts; {len(every) + 1} asked"):
        synthetic_prompts(len(every) + 1, 0)


def test_heldout_split_is_stable_by_id():
    ids = [f"syn-0-{i:05d}" for i in range(2000)]
    held = [i for i in ids if is_heldout(i, 0.05)]
    assert 50 < len(held) < 150
    assert [i for i in ids[:1000] if is_heldout(i, 0.05)] == [i for i in held if i in ids[:1000]]


CHILD = """
import sys, time
from pathlib import Path
from kimidflash.background import serving_process
from kimidflash.commands import Command, dispatch
from kimidflash.train.cli import guarded
fake_serve = [sys.executable, "-c", "import time; print('serve: ready in 0.1s', flush=True); time.sleep(600)"]
def body():
    with serving_process("cfg.env", [], Path(sys.argv[1]) / "serve.log", cmd=fake_serve) as (proc, _):
        (Path(sys.argv[1]) / "server.pid").write_text(str(proc.pid))
        time.sleep(600)
def main(argv):
    return guarded(body, "rerun")
sys.exit(dispatch([Command("t", "__main__:main", "")], ["t"], prog="p", description=""))
"""


def test_sigterm_stops_a_training_command_and_the_server_it_started(tmp_path):
    """A regen killed with SIGTERM (a job scheduler, `timeout`, `kill`) once left its target server
    running: the server has its own session. Now SIGTERM ends the command as Ctrl-C does."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "server.pid"
    for _ in range(600):
        if pid_file.is_file() or child.poll() is not None:
            break
        time.sleep(0.1)
    assert pid_file.is_file(), child.communicate()[1]
    server = int(pid_file.read_text())
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 130
    assert "interrupted; rerun" in child.stderr.read()
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)
