"""The training engines as objects: one row per `train.engine`, each doing a run's
capture, train, eval and export its own way.

The phases (phases.py) are the pipeline's order; an engine is how a phase is
done. Keeping the choice in this one table, rather than an `if engine == ...`
in every phase, means a new engine (or a drafter family an engine trains
differently) is one class and one row, and a phase cannot forget a branch.

* ours: this package's trainer (one process, CPU or one device); capture
  writes shards, streams or holds the target's features (capture.check_mode).
* speculators: vllm-project/speculators under torchrun with FSDP2 (Kimi
  scale); its own data set and hidden-state files (speculators/).

Both read the run folder's records and export a drafter serve.sh accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from ..checkpoint_layout import text_field
from ..eagle3 import Eagle3Error
from ..errors import TrainConfigError
from ..logtail import Log
from . import eagle3_run
from .capture import capture_shards, check_mode
from .config import ENGINES, TrainConfig
from .config import METHODS as CONFIG_METHODS
from .evaluate import evaluate_run
from .export_run import export_run
from .manifest import Manifest
from .plan import Budget, Data, Plan, budget, check_ours, eagle3_plan, ours_plan, speculators_plan
from .speculators.capture import capture_offline
from .speculators.engine import eval_speculators, export_speculators, train_speculators
from .trainer import train


@dataclass(frozen=True)
class PhaseArgs:
    """The command-line options some phases (and so the engines doing them) read."""

    resume: bool = False
    max_steps: int | None = None
    max_seconds: float | None = None
    regen_limit: int | None = None
    drafter: str | None = None  # eval: an exported drafter instead of the run's checkpoint


class Engine(Protocol):
    name: str

    def check(self, cfg: TrainConfig) -> None:
        """Refuse, at setup, what this engine cannot train (before hours of regen)."""

    def capture(self, cfg: TrainConfig, run: Path, log: Log) -> str:
        """Prepare the target's features for training; returns what was done, for the log."""

    def train(self, cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> None: ...

    def evaluate(self, cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> dict:
        """The offline acceptance of the run's checkpoint (noted in the manifest) or of args.drafter."""

    def export(self, cfg: TrainConfig, run: Path, log: Log) -> Path: ...

    def plan(self, cfg: TrainConfig, data: Data, b: Budget) -> Plan:
        """`--plan`: memory per rank, disk and time of this engine training the config's drafter."""


def make_plan(cfg: TrainConfig, run: Path, data: Data) -> Plan:
    """`./train-drafter.sh CONFIG --plan`: the config's engine sizes its run against the cluster."""
    return engine_for(cfg).plan(cfg, data, budget(cfg, run))


def _dflash_drafter(cfg: TrainConfig, tconf: dict, tok: Any) -> tuple[dict, dict | None]:
    shape = cfg.shape()
    vocab, hidden, layers = (text_field(tconf, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers"))
    mask = shape.mask_token_id
    if not 0 <= mask < vocab:
        raise TrainConfigError(f"{cfg.drafter_config}: mask_token_id {mask} outside the target's vocab")
    if shape.vocab_size != vocab or shape.hidden_size != hidden:
        raise TrainConfigError(
            f"{cfg.drafter_config}: vocab/hidden {shape.vocab_size}/{shape.hidden_size}"
            f" differ from the target's {vocab}/{hidden}"
        )
    shape.check_target(layers)
    if cfg.train.anchor_l2:
        raise TrainConfigError(f"{cfg.path}: train.anchor_l2 is for EAGLE-3 fine-tunes (train.method eagle3)")
    return shape.as_dict(), {"id": mask, "token": tok.convert_ids_to_tokens(mask)}


def _eagle3_drafter(cfg: TrainConfig, tconf: dict, tok: Any) -> tuple[dict, dict | None]:
    head = cfg.head()
    try:
        head.check_target(tconf, "the target")
    except Eagle3Error as exc:
        raise TrainConfigError(f"{cfg.drafter_config}: {exc}") from None
    if cfg.train.anchor_l2 and not cfg.train.init_from_drafter:
        raise TrainConfigError(
            f"{cfg.path}: train.anchor_l2 pulls toward train.init_from_drafter's weights: set it, or anchor_l2 0"
        )
    if cfg.train.ttt_steps < 1:
        raise TrainConfigError(f"{cfg.path}: train.ttt_steps {cfg.train.ttt_steps}: expected >= 1")
    return dict(head.raw), None


@dataclass(frozen=True)
class Method:
    """How our engine trains one drafter family (`train.method`)."""

    check_drafter: Callable[[TrainConfig, dict, Any], tuple[dict, dict | None]]  # -> (its JSON, mask token)
    fits: Callable[[TrainConfig], None]  # refuses, before a step, a drafter our trainer cannot hold
    plan: Callable[[TrainConfig, Data, Budget], Plan]
    train: Callable[[TrainConfig, Path, PhaseArgs, Log], Any]
    evaluate: Callable[[TrainConfig, Path, PhaseArgs, Log], dict]
    export: Callable[[TrainConfig, Path, Log], Path]


def _dflash_eval(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> dict:
    return evaluate_run(cfg, run, log=log, drafter=args.drafter)


def _eagle3_eval(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> dict:
    if args.drafter is not None:
        raise TrainConfigError(
            "eval --drafter measures exported DFlash drafters; an EAGLE-3 run measures its own checkpoint"
        )
    return eagle3_run.evaluate(cfg, run, log=log)


METHODS: dict[str, Method] = {
    "dflash": Method(
        _dflash_drafter,
        check_ours,
        ours_plan,
        lambda cfg, run, a, log: train(
            cfg, run, resume=a.resume, stop_at=a.max_steps, log=log, max_seconds=a.max_seconds
        ),
        _dflash_eval,
        lambda cfg, run, log: export_run(cfg, run, log=log),
    ),
    "eagle3": Method(
        _eagle3_drafter,
        lambda cfg: None,  # one MLA layer: its --plan sizes it, nothing to refuse at setup
        eagle3_plan,
        lambda cfg, run, a, log: eagle3_run.train(cfg, run, a.resume, a.max_steps, log=log, max_seconds=a.max_seconds),
        _eagle3_eval,
        lambda cfg, run, log: eagle3_run.export(cfg, run, log=log),
    ),
}
assert tuple(METHODS) == CONFIG_METHODS, "config.METHODS names the families this table holds, in its order"


def method_for(cfg: TrainConfig) -> Method:
    return METHODS[cfg.train.method]  # config.load refuses any other


class Ours:
    name = "ours"

    def check(self, cfg: TrainConfig) -> None:
        method_for(cfg).fits(cfg)

    def plan(self, cfg: TrainConfig, data: Data, b: Budget) -> Plan:
        return method_for(cfg).plan(cfg, data, b)

    def capture(self, cfg: TrainConfig, run: Path, log: Log) -> str:
        mode = check_mode(cfg)
        if mode != "cache":
            return (
                f"mode={mode}, hidden states are computed when training starts "
                f"({'every batch' if mode == 'stream' else 'once, into memory'}; nothing cached on disk)"
            )
        return f"{capture_shards(cfg, run, log=log)} shards in {run / 'capture'}"

    def train(self, cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> None:
        method_for(cfg).fits(cfg)
        method_for(cfg).train(cfg, run, args, log)

    def evaluate(self, cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> dict:
        res = method_for(cfg).evaluate(cfg, run, args, log)
        if args.drafter is None:
            Manifest.open(run).note_eval(res)
        return res

    def export(self, cfg: TrainConfig, run: Path, log: Log) -> Path:
        return method_for(cfg).export(cfg, run, log)


class Speculators:
    name = "speculators"

    METHODS = ("dflash",)  # speculators 0.9.0 trains EAGLE-3 heads with Llama and Qwen3 layers only, not MLA

    def check(self, cfg: TrainConfig) -> None:
        """The config's own checks, and DFlash only: the train phase refuses a run with no GPU and no dry run."""
        if cfg.train.method not in self.METHODS:
            raise TrainConfigError(
                f"{cfg.path}: train.engine speculators trains DFlash drafters here; "
                f"train.method {cfg.train.method} runs on train.engine ours (speculators 0.9.0 "
                "trains EAGLE-3 heads with Llama and Qwen3 layers only, not MLA)"
            )

    def plan(self, cfg: TrainConfig, data: Data, b: Budget) -> Plan:
        if cfg.train.method in self.METHODS:
            return speculators_plan(cfg, data, b)
        refusal = (  # train.method eagle3, the one family not in METHODS
            "train.engine=speculators: speculators 0.9.0 builds EAGLE-3 heads with Llama and Qwen3 "
            "layers only; this recipe trains EAGLE-3 heads on its own engine (train.engine=ours)"
        )
        return method_for(cfg).plan(cfg, data, replace(b, refusals=(*b.refusals, refusal)))

    def capture(self, cfg: TrainConfig, run: Path, log: Log) -> str:
        return str(capture_offline(cfg, run, log=log))

    def train(self, cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> None:
        train_speculators(cfg, run, args.resume, args.max_steps, log=log)

    def evaluate(self, cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> dict:
        return eval_speculators(cfg, run, args.drafter, log=log)

    def export(self, cfg: TrainConfig, run: Path, log: Log) -> Path:
        return export_speculators(cfg, run, log=log)


TABLE: dict[str, Engine] = {e.name: e for e in (Ours(), Speculators())}
assert tuple(TABLE) == ENGINES, "config.ENGINES names the engines this table holds, in its order"


def engine_for(cfg: TrainConfig) -> Engine:
    try:
        return TABLE[cfg.train.engine]
    except KeyError:  # config.py refuses it on load; a TrainConfig built by hand may not have been
        raise TrainConfigError(
            f"{cfg.path}: train.engine {cfg.train.engine!r}: expected one of {', '.join(TABLE)}"
        ) from None
