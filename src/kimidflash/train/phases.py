"""The pipeline's phases, in order, as a table: setup, regen, capture, train, eval, export.

Each phase reads what the previous one wrote in the run folder and is
resumable: regen skips answered prompts, capture skips written shards, train
continues from its last checkpoint with `--resume`. The command (cli.py) only
picks which rows of PHASES to run; adding a phase is a function and a row.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..background import served
from ..checkpoint_layout import text_field
from ..config import load_config, parse_overrides
from ..cpu_reference import smollm2
from ..cpu_reference.generated import PREPARE_KIND
from ..fsio import write_text_atomic
from ..prepare import prepare
from . import device
from .capture import capture_shards, check_mode
from .config import TrainConfig
from .data import load_prompts, read_records
from .errors import TrainConfigError
from .evaluate import evaluate_run
from .export_run import export_run
from .manifest import Manifest
from .plan import check_ours
from .regen import regen
from .regen_hf import regen_hf
from .speculators.capture import capture_offline
from .speculators.engine import eval_speculators, export_speculators, train_speculators
from .target import load_tokenizer, target_info
from .trainer import train

Log = Callable[[str], None]


@dataclass(frozen=True)
class PhaseArgs:
    """The command-line options some phases read."""

    resume: bool = False
    max_steps: int | None = None
    max_seconds: float | None = None
    regen_limit: int | None = None
    drafter: str | None = None  # eval: an exported drafter instead of the run's checkpoint


def phase_setup(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    """Check the target against the drafter shape, write the prompt list and start the manifest.

    The target's numbers are its text model's (checkpoint_layout.text_field: Kimi K2.6 nests them
    under text_config), and its tokenizer is loaded as the serve config says (target.load_tokenizer)."""
    shape = cfg.shape()
    info = target_info(cfg)
    target = Path(info.model_dir)
    if info.prepare == "smollm2":
        smollm2.ensure(target, log=log)
    elif info.prepare in PREPARE_KIND:  # a generated pair: made by serve's own step (venv, generator)
        prepare(load_config(cfg.target.serve_config, parse_overrides(cfg.target.serve_overrides)), log=log)
    if not (target / "config.json").is_file():
        raise TrainConfigError(f"target checkpoint not found: {target}/config.json")
    tconf = json.loads((target / "config.json").read_text())
    vocab, hidden, layers = (text_field(tconf, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers"))
    if not all(isinstance(v, int) for v in (vocab, hidden, layers)):
        raise TrainConfigError(f"{target}/config.json: no vocab_size, hidden_size and num_hidden_layers at the top "
                               "level or under text_config")
    tok = load_tokenizer(info)
    mask = shape.mask_token_id
    if not 0 <= mask < vocab:
        raise TrainConfigError(f"{cfg.drafter_config}: mask_token_id {mask} outside the target's vocab")
    if shape.vocab_size != vocab or shape.hidden_size != hidden:
        raise TrainConfigError(f"{cfg.drafter_config}: vocab/hidden {shape.vocab_size}/{shape.hidden_size}"
                               f" differ from the target's {vocab}/{hidden}")
    shape.check_target(layers)
    if cfg.train.engine == "ours":  # refused before hours of regen, not at the first step
        check_ours(cfg)
    prompts = load_prompts(cfg.data.prompts, cfg.seed, evaluation_only=evaluation_only(cfg))
    run.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(run).free / 2**30
    if free < cfg.data.min_free_disk_gb:
        raise TrainConfigError(f"{run}: {free:.1f} GiB free, config asks for {cfg.data.min_free_disk_gb}")
    write_text_atomic(run / "prompts.jsonl", "".join(json.dumps(p) + "\n" for p in prompts))
    Manifest.open(run).set_setup(cfg.as_dict(), shape, target, tok.convert_ids_to_tokens(mask), len(prompts))
    log(f"setup: run folder {run}; {len(prompts)} prompts; target {target}; mask token {mask} "
        f"({tok.convert_ids_to_tokens(mask)!r}); {free:.0f} GiB free")


def phase_regen(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    """The target's own answers to the prompts (served by the recipe or at regen.base_url, or regen.source=hf)."""
    prompts = [json.loads(l) for l in (run / "prompts.jsonl").read_text().splitlines() if l.strip()]
    r = cfg.regen
    if r.records:
        prompts = prompts[: r.records]
    info = target_info(cfg)
    kw = dict(concurrency=r.concurrency, max_tokens=r.max_tokens, temperature=r.temperature, seed=cfg.seed,
              limit=args.regen_limit)
    out = run / "regen.jsonl"
    have = {x.id for x in read_records(out)}
    if len(have & {p["id"] for p in prompts}) == len(prompts):
        log("regen: every prompt already answered")
        return
    if r.source not in ("server", "hf"):
        raise TrainConfigError(f"{cfg.path}: regen.source {r.source!r}: expected server or hf")
    where: dict[str, str] = {}
    try:
        if r.source == "hf":
            todo = [p for p in prompts if p["id"] not in have][: args.regen_limit]
            dev = device.resolve(cfg.train.device)
            where = {"device": device.describe(dev)}
            log(f"regen: {len(todo)} prompts through a Hugging Face generate() on {dev}, {r.concurrency} per batch")
            n = regen_hf(info.model_dir, todo, out, batch=r.concurrency, max_tokens=r.max_tokens,
                         temperature=r.temperature, device=dev, trust_remote_code=info.trust_remote_code)
        elif r.base_url:
            n = regen(r.base_url.rstrip("/").removesuffix("/v1"), info.served_name, prompts, out, **kw)
        else:
            log(f"regen: starting the target with {cfg.target.serve_config} {cfg.target.serve_overrides}")
            with served(cfg.target.serve_config, cfg.target.serve_overrides, run / "regen-server.log") as base:
                n = regen(base, info.served_name, prompts, out, **kw)
    finally:  # an interrupted regen keeps its whole batches or records: the manifest counts them too
        Manifest.open(run).note_regen(out, {**r.as_dict(), **where})
    log(f"regen: {n} new records in {out}")


def phase_capture(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    if cfg.train.engine == "speculators":  # speculators' own data set and hidden-state files (speculators/capture.py)
        log(f"capture: {capture_offline(cfg, run, log=log)}")
        return
    mode = check_mode(cfg)
    if mode != "cache":
        log(f"capture: mode={mode}, hidden states are computed when training starts "
            f"({'every batch' if mode == 'stream' else 'once, into memory'}; nothing cached on disk)")
        return
    n = capture_shards(cfg, run, log=log)
    log(f"capture: {n} shards in {run / 'capture'}")


def evaluation_only(cfg: TrainConfig) -> bool:
    """data.heldout_fraction = 1: every record is held out, the run only measures drafters (`eval --drafter`)."""
    return cfg.data.heldout_fraction >= 1.0


def phase_train(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    if evaluation_only(cfg):
        raise TrainConfigError(f"{cfg.path}: data.heldout_fraction is 1, an evaluation-only run: nothing to "
                               "train on (measure a drafter with `eval --drafter DIR`)")
    if cfg.train.engine == "speculators":
        train_speculators(cfg, run, args.resume, args.max_steps, log=log)
        return
    check_ours(cfg)
    train(cfg, run, resume=args.resume, stop_at=args.max_steps, log=log, max_seconds=args.max_seconds)


def phase_eval(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    """The checkpoint's offline acceptance (noted in the manifest), or an exported drafter's (--drafter)."""
    if cfg.train.engine == "speculators":
        eval_speculators(cfg, run, args.drafter, log=log)
        return
    res = evaluate_run(cfg, run, log=log, drafter=args.drafter)
    if args.drafter is None:
        Manifest.open(run).note_eval(res)


def phase_export(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    if cfg.train.engine == "speculators":
        export_speculators(cfg, run, log=log)
        return
    out = export_run(cfg, run, log=log)
    log(f"export: {out}")


PhaseFn = Callable[[TrainConfig, Path, PhaseArgs, Log], None]
PHASES: dict[str, PhaseFn] = {"setup": phase_setup, "regen": phase_regen, "capture": phase_capture,
                              "train": phase_train, "eval": phase_eval, "export": phase_export}
