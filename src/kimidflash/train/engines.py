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

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from .capture import capture_shards, check_mode
from .config import ENGINES, TrainConfig
from .errors import TrainConfigError
from .evaluate import evaluate_run
from .export_run import export_run
from .manifest import Manifest
from .plan import check_ours
from .speculators.capture import capture_offline
from .speculators.engine import eval_speculators, export_speculators, train_speculators
from .trainer import train

Log = Callable[[str], None]


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


class Ours:
    name = "ours"

    def check(self, cfg: TrainConfig) -> None:
        check_ours(cfg)

    def capture(self, cfg: TrainConfig, run: Path, log: Log) -> str:
        mode = check_mode(cfg)
        if mode != "cache":
            return (f"mode={mode}, hidden states are computed when training starts "
                    f"({'every batch' if mode == 'stream' else 'once, into memory'}; nothing cached on disk)")
        return f"{capture_shards(cfg, run, log=log)} shards in {run / 'capture'}"

    def train(self, cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> None:
        check_ours(cfg)
        train(cfg, run, resume=args.resume, stop_at=args.max_steps, log=log, max_seconds=args.max_seconds)

    def evaluate(self, cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log) -> dict:
        res = evaluate_run(cfg, run, log=log, drafter=args.drafter)
        if args.drafter is None:
            Manifest.open(run).note_eval(res)
        return res

    def export(self, cfg: TrainConfig, run: Path, log: Log) -> Path:
        return export_run(cfg, run, log=log)


class Speculators:
    name = "speculators"

    def check(self, cfg: TrainConfig) -> None:
        """Nothing beyond the config's own checks: the train phase refuses a run with no GPU and no dry run."""

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
        raise TrainConfigError(f"{cfg.path}: train.engine {cfg.train.engine!r}: expected one of "
                               f"{', '.join(TABLE)}") from None
