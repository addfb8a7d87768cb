"""The train, eval and export phases for train.engine=speculators (capture is capture.py).

* train: `speculators train` on what capture wrote, shaped by our DrafterShape
  (commands.draft_config) or warm-started from the drafter we serve
  (train.init_from_drafter, converted by `speculators convert`). Under
  torchrun with FSDP2 on the cluster's GPUs; on a machine without one only
  `speculators.dry_run` runs (it builds the drafter and saves it, the step
  CI takes). speculators resumes from its own numbered checkpoints, so
  `--resume` continues and a folder with checkpoints is not started over
  unless asked.
* eval: the latest checkpoint exported to our format in the run folder and
  measured by our walk eval on the held-out records, features streamed from
  the target (our capture: the same layers the drafter reads).
* export: that checkpoint as a drafter folder serve.sh accepts, with the run's
  provenance (manifest, config, speculators' own train command).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ...checkpoint_layout import require_config
from ...errors import SpeculatorsCheckpointError, TrainConfigError
from ...logtail import Log
from ...paths import portable, portable_argv
from ..config import TrainConfig
from ..evaluate import evaluate_run
from ..manifest import Manifest
from ..target import target_info
from .cli import run_logged, speculators_argv, torchrun_argv
from .commands import options_from, train_args, write_draft_config
from .export import check_config, checkpoint_dir, to_recipe_drafter, to_speculators

RDZV_ENV = "KIMIDFLASH_RDZV_ENDPOINT"  # host:port of the first node, for torchrun across nodes


def folder(run: Path) -> Path:
    return run / "speculators"


def _has_checkpoints(save: Path) -> bool:
    return save.is_dir() and any(p.is_dir() and p.name.isdigit() for p in save.iterdir())


def train_speculators(cfg: TrainConfig, run: Path, resume: bool, max_steps: int | None, log: Log = print) -> Path:
    """Run `speculators train` (torchrun on GPUs, or a dry run); returns its save path."""
    spec, shape, info, sp, cl = folder(run), cfg.shape(), target_info(cfg), cfg.speculators, cfg.cluster
    world = cl.nodes * cl.gpus_per_node
    if cfg.train.select_every:
        raise TrainConfigError(
            f"{cfg.path}: train.select_every is our engine's (train.engine ours); speculators keeps its own checkpoints"
        )
    if not sp.dry_run and not world:
        raise TrainConfigError(
            f"{cfg.path}: speculators trains on GPUs under torchrun and cluster.gpus_per_node is "
            "0; set it (./train-drafter.sh CONFIG --plan sizes the run), or "
            "speculators.dry_run=true to build and save the drafter without training"
        )
    if not sp.dry_run and not (spec / "captured.txt").is_file():
        raise TrainConfigError(f"{run}: no complete capture for the speculators engine; run the capture phase")
    save = spec / ("dry-run" if sp.dry_run else "checkpoints")
    if _has_checkpoints(save) and not resume:
        raise TrainConfigError(
            f"{save}: holds checkpoints of an earlier run; --resume continues it, or remove the folder to start over"
        )
    opts = options_from(
        cfg.train,
        cfg.seed,
        sp.max_length,
        epochs=sp.epochs,
        fsdp_shard=sp.fsdp_shard and world > 1,
        max_steps=max_steps or cfg.train.steps,
        num_workers=8 if world else 2,
    )
    if cfg.train.init_from_drafter:  # warm start: the served drafter in speculators' format, at the training block
        start = to_speculators(
            cfg.train.init_from_drafter,
            info.model_dir,
            spec / "warm-start",
            spec / "convert.log",
            block_size=cfg.train.block_size,
            echo=log,
        )
        # speculators takes the shape from the checkpoint: one unlike ours would train, then fail export
        check_config(
            require_config(start, "speculators warm start", SpeculatorsCheckpointError),
            shape,
            f"train.init_from_drafter {cfg.train.init_from_drafter}",
        )
        model = {"from_pretrained": start}
    else:
        model = {"draft_config_path": write_draft_config(shape, spec / "draft-config.json")}
    tail = [
        *train_args(
            shape,
            info.model_dir,
            spec / "data",
            spec / "hidden_states",
            save,
            opts,
            dry_run=sp.dry_run,
            resume=resume,
            log_dir=spec / "logs",
            trust_remote_code=info.trust_remote_code,
            **model,
        ),
        *sp.extra_args,
    ]
    if sp.dry_run:
        argv = speculators_argv("train", *tail)
    else:
        endpoint = os.environ.get(RDZV_ENV) if cl.nodes > 1 else None
        if cl.nodes > 1 and not endpoint:
            raise TrainConfigError(
                f"cluster.nodes={cl.nodes}: set {RDZV_ENV}=HOST:PORT (the first node) and "
                "run the same command on every node"
            )
        argv = torchrun_argv(cl.gpus_per_node, cl.nodes, *tail, rdzv_endpoint=endpoint)
    log(f"train: speculators {'dry run' if sp.dry_run else f'on {world} GPUs'} into {save}")
    Manifest.open(run).note(
        "train",
        {
            "engine": "speculators",
            "dry_run": sp.dry_run,
            "save_path": portable(save),
            "command": portable_argv(argv),
            "options": opts.as_dict(),
            "warm_start": portable(cfg.train.init_from_drafter) if cfg.train.init_from_drafter else None,
        },
    )
    run_logged(argv, spec / "train.log", "speculators train", echo=log)
    return save


def latest(cfg: TrainConfig, run: Path) -> Path:
    """The checkpoint the train phase left: the dry run's folder, or the highest epoch of the save path."""
    save = folder(run) / ("dry-run" if cfg.speculators.dry_run else "checkpoints")
    if not save.is_dir():
        raise TrainConfigError(f"{save}: no speculators checkpoint; run the train phase")
    return checkpoint_dir(save)


def _export(cfg: TrainConfig, run: Path, out: Path) -> Path:
    shape = cfg.shape()
    if cfg.export.block_size:
        shape = shape.with_block_size(cfg.export.block_size)
    m = Manifest.open(run).data
    provenance = {
        "name": cfg.name,
        "engine": "speculators",
        "config": portable(cfg.path),
        "run": {k: m.get(k) for k in ("setup", "regen", "capture", "train", "invocations") if k in m},
    }
    return to_recipe_drafter(latest(cfg, run), shape, out, cfg.export.dtype, provenance)


def eval_speculators(cfg: TrainConfig, run: Path, drafter: str | None, log: Log = print) -> dict:
    """Our walk eval of the latest checkpoint (exported into the run folder first), or of `drafter`."""
    streamed = replace(cfg, capture=replace(cfg.capture, mode="stream"))  # our capture wrote no shards
    if drafter is not None:
        return evaluate_run(streamed, run, log=log, drafter=drafter)
    res = evaluate_run(
        streamed, run, log=log, drafter=str(_export(cfg, run, folder(run) / "eval-drafter")), result="eval.json"
    )
    Manifest.open(run).note_eval(res)
    return res


def export_speculators(cfg: TrainConfig, run: Path, log: Log = print) -> Path:
    if not cfg.export.out:
        raise TrainConfigError(f"{cfg.path}: export.out is not set")
    log(f"export: from {latest(cfg, run)}")
    return _export(cfg, run, Path(cfg.export.out))
