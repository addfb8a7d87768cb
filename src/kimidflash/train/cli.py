"""`kimidflash train CONFIG [phases] [--skip-setup] [--skip-regen] [--resume]` (train-drafter.sh).

Phases, in order: setup, regen, capture, train, eval, export (phases.py).
Each one reads what the previous wrote in the run folder and is resumable:
regen skips answered prompts, capture skips written shards, train continues
from its last checkpoint with `--resume`. train-drafter.sh is a thin wrapper
over this. Exit status: 0 done, 2 bad input (one line naming the culprit),
130 interrupted (Ctrl-C or SIGTERM: either way the target server regen or
capture started is stopped, not left running).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..background import sigterm_as_interrupt
from ..cliargs import add_config
from ..errors import EXIT_OK, TrainConfigError
from ..fsio import utc_now
from ..paths import CONFIGS_DIR, portable_argv
from . import config as tcfg
from .engines import make_plan
from .manifest import Manifest
from .phases import PHASES, PhaseArgs
from .plan import count_data


def _record_invocation(run: Path, invocation: dict[str, Any]) -> None:
    """Every command run on this folder, in order: the manifest says how to reproduce the drafter."""
    m = Manifest.open(run)
    m.data.setdefault("invocations", []).append(dict(invocation, utc=utc_now()))
    m.save()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kimidflash train", description=__doc__.splitlines()[0])
    add_config(
        p, default=str(CONFIGS_DIR / "train-cpu-reference.json"), set_help="override a config key, e.g. train.steps=50"
    )
    p.add_argument("phases", nargs="*", help=f"subset of {', '.join(PHASES)} (default: all)")
    p.add_argument("--skip-setup", action="store_true")
    p.add_argument("--skip-regen", action="store_true")
    p.add_argument("--resume", action="store_true", help="continue training from the run's last checkpoint")
    p.add_argument("--max-steps", type=int, help="stop training after this global step (a chunk); resume later")
    p.add_argument(
        "--max-seconds",
        type=float,
        help="stop training at the first step that ends after this many seconds (a wall-clock chunk)",
    )
    p.add_argument("--regen-limit", type=int, help="answer at most this many new prompts (a chunk)")
    p.add_argument(
        "--drafter",
        help="eval: an exported drafter folder to measure on the run's records "
        "instead of the run's checkpoint (written to eval-<folder>.json)",
    )
    p.add_argument("--run-dir", help="override the run folder")
    p.add_argument(
        "--plan",
        action="store_true",
        help="run nothing: print the memory per rank, the disk for captured hidden states and the time "
        "for the cluster the config describes (cluster.*), and exit 2 if it cannot fit",
    )
    p.add_argument("--samples", type=int, help="--plan: training samples (default: the run's records, or the prompts)")
    p.add_argument("--tokens-per-sample", type=int, help="--plan: mean tokens per sample (with --samples)")
    return p


def _chosen(a: argparse.Namespace) -> list[str]:
    """The phases to run, in pipeline order."""
    bad = [x for x in a.phases if x not in PHASES]
    if bad:
        raise TrainConfigError(f"unknown phase '{bad[0]}' (phases: {', '.join(PHASES)})")
    skip = ({"setup"} if a.skip_setup else set()) | ({"regen"} if a.skip_regen else set())
    return [x for x in PHASES if (not a.phases or x in a.phases) and x not in skip]


def run(a: argparse.Namespace, argv: list[str]) -> None:
    over = tcfg.parse_set(a.set)
    if a.run_dir:
        over["run_dir"] = os.path.abspath(a.run_dir)
    cfg = tcfg.load(a.config, over)
    if a.plan:
        plan = make_plan(
            cfg, Path(cfg.run_dir or ""), count_data(cfg, Path(cfg.run_dir or ""), a.samples, a.tokens_per_sample)
        )
        print(plan.text())
        if plan.refusals:
            raise TrainConfigError(f"the plan for {Path(cfg.path).name} does not fit: {plan.refusals[0]}")
        return
    phases = _chosen(a)
    if a.drafter and phases != ["eval"]:
        raise TrainConfigError("--drafter measures an exported drafter: run the eval phase alone with it")
    run_dir = Path(cfg.run_dir or "")
    if phases and phases[0] != "setup" and not (run_dir / "manifest.json").is_file():
        raise TrainConfigError(f"{run_dir}: no manifest.json; run the setup phase first")
    invocation = {"argv": portable_argv(["./train-drafter.sh", *argv]), "phases": phases}
    if a.max_seconds is not None and not a.max_seconds > 0:
        raise TrainConfigError(f"--max-seconds must be positive, got {a.max_seconds}")
    args = PhaseArgs(
        resume=a.resume,
        max_steps=a.max_steps,
        regen_limit=a.regen_limit,
        max_seconds=a.max_seconds,
        drafter=a.drafter and os.path.abspath(a.drafter),
    )
    for name in phases:
        if name != "setup" and name == phases[0]:
            _record_invocation(run_dir, invocation)
        PHASES[name](cfg, run_dir, args, print)
        if name == "setup":  # the manifest exists from here on
            _record_invocation(run_dir, invocation)


def guarded(body: Callable[[], None], on_interrupt: str) -> int:
    """Run a training command's body. Ctrl-C or SIGTERM (taken as Ctrl-C, so a server the phase started in
    its own session is stopped too) first says how to go on; the dispatcher gives it, and every error, its
    exit status."""
    try:
        with sigterm_as_interrupt():
            body()
    except KeyboardInterrupt:
        print(f"interrupted; {on_interrupt}", file=sys.stderr)
        raise
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_intermixed_args(argv)  # phases may come after options
    return guarded(lambda: run(a, argv), "rerun with --resume (training) or the same command (other phases)")
