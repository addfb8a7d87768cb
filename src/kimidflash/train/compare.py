"""`python -m kimidflash train-compare`: training changes measured at equal wall time.

    python -m kimidflash train-compare configs/train-cpu-reference.json --base-run RUN \\
        --seconds 900 --out benchmarks/drafter/training-changes \\
        --variant baseline --variant vocab8k train.vocab_subset=8192

A change that makes steps cheaper but learns less per step is no gain, and
neither is one that learns more per step at twice the cost: what counts is
the held-out acceptance a fixed amount of CPU time buys. Each variant trains
from scratch for `--seconds` of wall time on the captured data of one base run
(its setup and capture phases done: the folder is shared, not copied), then
the eval phase measures offline acceptance on the held-out split, and on the
held-out records of each `--eval-run NAME=CONFIG` (an evaluation-only run,
`data.heldout_fraction = 1`, its regen and capture done: prompts of tasks the
base run never saw, where a change that only fits the training tasks shows).
One result
file per variant (`NAME.json`, with steps, steps/s, loss and acceptance per
k, the overrides and the provenance), written atomically; a variant whose
file exists is skipped, so an interrupted comparison resumes. `summary.md`
tabulates every file in `--out`. Run variants with nothing else on the
machine: they are timed one after another.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TrainConfigError
from ..fsio import read_json_object, utc_now, write_json_atomic, write_text_atomic
from ..mdtable import table
from ..paths import cache_dir, portable, portable_argv
from . import config as tcfg
from .evaluate import evaluate_run
from .manifest import portable_train, versions
from .trainer import train

SCHEMA = "kimidflash-train-compare/1"
SHARED = ("capture",)  # symlinked: the captured features every variant reads
COPIED = ("manifest.json", "prompts.jsonl", "regen.jsonl")  # each variant's own (train and eval write notes)


def variant_run(base: Path, work: Path) -> Path:
    """A fresh run folder that reads the base run's data."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for name in COPIED:
        shutil.copy2(base / name, work / name)
    for name in SHARED:
        (work / name).symlink_to((base / name).resolve(), target_is_directory=True)
    return work


def portable_overrides(sets: dict[str, Any]) -> dict[str, Any]:
    """Overrides as result files record them: a path value (train.init_from_drafter=/abs/...) made portable."""
    return {k: portable(v) if isinstance(v, str) else v for k, v in sets.items()}


def eval_runs(specs: list[str]) -> dict[str, tcfg.TrainConfig]:
    """--eval-run NAME=CONFIG: each an evaluation-only config whose run holds captured records."""
    out: dict[str, tcfg.TrainConfig] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            raise TrainConfigError(f"--eval-run {spec}: expected NAME=CONFIG")
        cfg = tcfg.load(path)
        if cfg.data.heldout_fraction < 1.0:
            raise TrainConfigError(
                f"--eval-run {name}: {path} is not evaluation-only (data.heldout_fraction "
                f"{cfg.data.heldout_fraction}, must be 1): its records could be trained on"
            )
        assert cfg.run_dir is not None, "tcfg.load sets run_dir"
        if not (Path(cfg.run_dir) / "capture").is_dir():
            raise TrainConfigError(
                f"--eval-run {name}: {cfg.run_dir} has no capture/ folder; run its setup, regen and capture phases"
            )
        out[name] = cfg
    return out


def _offline(ev: dict[str, Any]) -> dict[str, Any]:
    return {
        k: {
            "mean_acceptance_length": v["mean_acceptance_length"],
            "per_position": v["per_position"],
            "drafts": v["drafts"],
            "walk_mean_acceptance_length": v["walk"]["mean_acceptance_length"],
        }
        for k, v in ev["by_k"].items()
    }


def run_variant(
    config: str,
    base: Path,
    name: str,
    sets: dict[str, Any],
    seconds: float,
    work: Path,
    argv: list[str],
    started: dict[str, Any],
    evals: dict[str, tcfg.TrainConfig] | None = None,
) -> dict[str, Any]:
    """Train and evaluate one variant; `started`: the versions (git commit included) when the command began."""
    run = variant_run(base, work / name)
    cfg = tcfg.load(config, {**sets, "run_dir": str(run)})
    res = train(cfg, run, resume=False, max_seconds=seconds)
    ev = evaluate_run(cfg, run)
    elsewhere = {}
    for other, ecfg in (evals or {}).items():  # scored as this variant was trained: its block, its autocast
        ecfg = tcfg.load(ecfg.path, {"train.block_size": cfg.train.block_size, "train.autocast": cfg.train.autocast})
        assert ecfg.run_dir is not None, "tcfg.load sets run_dir"
        e = evaluate_run(ecfg, Path(ecfg.run_dir), checkpoint_run=run, result=f"eval-compare-{name}.json")
        elsewhere[other] = {"records": e["records"], "by_k": _offline(e), "config": portable(ecfg.path)}
    return {
        "schema": SCHEMA,
        "variant": name,
        "overrides": portable_overrides(sets),
        "budget_seconds": seconds,
        "train_seconds": round(res["seconds"], 1),
        "steps": res["step"],
        "steps_per_second": round(res["step"] / res["seconds"], 4) if res["seconds"] else None,
        "loss_mean_last50": round(res["loss_mean_last50"], 4),
        "vocab_per_step": res["history"][-1].get("vocab") if res["history"] else None,
        "offline": _offline(ev),
        "heldout_records": ev["records"],
        "offline_on": elsewhere,
        "config": portable(config),
        "base_run": portable(base),
        "train": portable_train(cfg.train),
        "versions": started,
        "utc": utc_now(),
        "command": portable_argv(argv),
    }


def summary_markdown(results: list[dict[str, Any]]) -> str:
    ks = sorted({k for r in results for k in r["offline"]}, key=int)
    others = [n for n in (results[0].get("offline_on") or {})] if results else []
    head = [
        "variant",
        "overrides",
        "steps",
        "steps/s",
        "loss (last 50)",
        *[f"offline AL k={k}" for k in ks],
        *[f"walk AL k={k} on {n}" for n in others for k in ks],
    ]
    body = []
    for r in results:
        over = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in r["overrides"].items()) or "(the config as is)"
        on = r.get("offline_on") or {}
        cells = [
            r["variant"],
            over,
            str(r["steps"]),
            f"{r['steps_per_second']:.3f}",
            f"{r['loss_mean_last50']:.3f}",
            *[f"{r['offline'][k]['mean_acceptance_length']:.4f}" if k in r["offline"] else "-" for k in ks],
            *[
                f"{on[n]['by_k'][k]['walk_mean_acceptance_length']:.4f} ({on[n]['records']} records)"
                if k in on.get(n, {}).get("by_k", {})
                else "-"
                for n in others
                for k in ks
            ],
        ]
        body.append(cells)
    rows = table(head, body)
    first = results[0] if results else {}
    walks = (
        " The walk columns score the same checkpoint, as a server walks, on each `--eval-run`'s records."
        if others
        else ""
    )
    return (
        f"# Training changes at equal wall time\n\nEach variant trained a fresh run (from noise, or from what "
        f"its `train.init_*` names) for {first.get('budget_seconds')} s on the same captured data, then was "
        f"evaluated offline on the run's held-out split (AL: mean acceptance length, scored with the full LM "
        f"head as vLLM does).{walks} The loss "
        f"is over each step's softmax vocabulary, so it is not comparable across `train.vocab_subset` "
        f"settings. Written by `python -m kimidflash train-compare`; one JSON per variant beside this file "
        f"holds the command, the versions and the machine.\n\n" + "\n".join(rows) + "\n"
    )


@dataclass(frozen=True)
class CompareOptions:
    """What one `kimidflash train-compare` run is asked to do."""

    config: str
    base_run: Path
    seconds: float
    out: Path
    variant: list[list[str]]  # each: NAME, then KEY=VALUE overrides
    set: list[str] = field(default_factory=list)  # KEY=VALUE for every variant
    eval_run: list[str] = field(default_factory=list)  # NAME=CONFIG
    work: Path | None = None  # None: the cache's train-compare/OUT


def compare(a: CompareOptions, argv: list[str]) -> None:
    if not a.seconds > 0:
        raise TrainConfigError(f"--seconds must be positive, got {a.seconds}")
    if not (a.base_run / "capture").is_dir():
        raise TrainConfigError(f"--base-run {a.base_run}: no capture/ folder; run its setup and capture phases")
    names = [v[0] for v in a.variant]
    if len(set(names)) != len(names):
        raise TrainConfigError(f"--variant names repeat: {names}")
    common = tcfg.parse_set(a.set)
    plans = [(v[0], {**common, **tcfg.parse_set(v[1:])}) for v in a.variant]
    for _name, sets in plans:  # every variant's config is valid before the first one trains
        tcfg.load(a.config, sets)
    evals = eval_runs(a.eval_run)
    work = a.work or cache_dir() / "train-compare" / a.out.name
    started = versions()  # the code that runs is the code at the start
    a.out.mkdir(parents=True, exist_ok=True)
    for name, sets in plans:
        out = a.out / f"{name}.json"
        if out.is_file():
            print(f"train-compare: {out} exists; skipped")
            continue
        write_json_atomic(
            out,
            run_variant(
                a.config,
                a.base_run,
                name,
                sets,
                a.seconds,
                work,
                ["python", "-m", "kimidflash", "train-compare", *argv],
                started,
                evals,
            ),
        )
    results = [read_json_object(a.out / f"{n}.json", "comparison result", TrainConfigError) for n in names]
    write_text_atomic(a.out / "summary.md", summary_markdown(results))
    print(summary_markdown(results))
