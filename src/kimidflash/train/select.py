"""train.select_every: keep the checkpoint a server would accept most from, not the last one.

On little data a longer run overfits: the loss keeps falling while the walk on records the drafter
never saw stops rising or falls back (benchmarks/drafter/LOG.md, "longer is not better"). So every
`select_every` steps (and at the last step) rank 0 walks the run's held-out records, as a server
drafts (the family's offline acceptance at eval.k's first k, over train.select_records of them),
and writes `checkpoints/best.pt` when the walk beats every earlier one. Eval and export take best.pt
when there is one; `--resume` continues from last.pt and keeps the best walk so far. Both families
select this way: a DFlash drafter through evaluate.offline_acceptance, an EAGLE-3 head through
eagle3_run's (`measure`), so the two are kept by the same figure the A/B compares.

At least `select_records` (256 by default) held-out records must be captured: on fewer, the
difference between two checkpoints is within the walk's own noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import TrainConfigError
from ..logtail import Log
from . import device as dev
from .capture import SequenceStore, ShardStore, check_mode
from .config import TrainConfig
from .evaluate import offline_acceptance

# A family's offline acceptance: (model, held-out store, k, records) -> {"walk": {...}, ...}.
Measure = Callable[[Any, SequenceStore, int, int], dict[str, Any]]


@dataclass
class WalkSelect:
    """Called after every step; walks the held-out records every `every` steps and at `end`."""

    store: SequenceStore
    k: int
    records: int
    every: int
    autocast: str
    path: Path
    log: Log
    measure: Measure | None = None  # None: a DFlash drafter's, under `autocast`
    best: float = float("-inf")

    @classmethod
    def for_run(
        cls, cfg: TrainConfig, run: Path, resume: bool, log: Log = print, measure: Measure | None = None
    ) -> WalkSelect | None:
        """The run's selector, or None where train.select_every is unset; refuses a run that
        cannot select honestly (no captured held-out shards, or too few records)."""
        tc = cfg.train
        if not tc.select_every:
            return None
        if check_mode(cfg) != "cache":
            raise TrainConfigError(
                f"{cfg.path}: train.select_every walks the captured held-out shards: set capture.mode=cache"
            )
        held = ShardStore(run / "capture", "heldout")
        if len(held) < tc.select_records:
            raise TrainConfigError(
                f"{cfg.path}: train.select_every needs {tc.select_records} held-out records "
                f"(train.select_records), {run / 'capture'} holds {len(held)}: raise data.heldout_fraction"
            )
        path = run / "checkpoints" / "best.pt"
        sel = cls(held, cfg.eval.k[0], tc.select_records, tc.select_every, tc.autocast, path, log, measure)
        if path.is_file():
            if not resume:  # a fresh run: the old run's best says nothing about this one
                path.unlink(missing_ok=True)  # every rank builds a selector; the first removes it
            else:  # a best.pt kept by held-out loss (select_every set on resume) has no walk: any walk beats it
                sel.best = float(dev.load_to_cpu(path).get("walk", float("-inf")))
        return sel

    def __call__(self, model: torch.nn.Module, step: int, end: int) -> float | None:
        """The walk at this step (None where this step is not a selection point)."""
        if step % self.every and step != end:
            return None
        was = model.training
        model.eval()
        with torch.no_grad():
            res = (self.measure or self._dflash)(model, self.store, self.k, self.records)
        model.train(was)
        walk = float(res["walk"]["mean_acceptance_length"])
        kept = walk > self.best
        if kept:
            self.best = walk
            dev.atomic_save({"model": model.state_dict(), "step": step, "walk": walk}, self.path)
        self.log(
            f"train: step {step}: walk {walk:.4f} at k={self.k} on {self.records} held-out records"
            + (" (best so far: best.pt)" if kept else f" (best {self.best:.4f})")
        )
        return walk

    def _dflash(self, model: Any, store: SequenceStore, k: int, records: int) -> dict[str, Any]:
        return offline_acceptance(model, store, k, records, autocast=self.autocast)
