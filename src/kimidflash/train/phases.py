"""The pipeline's phases, in order, as a table: setup, regen, capture, train, eval, export.

Each phase reads what the previous one wrote in the run folder and is
resumable: regen skips answered prompts, capture skips written shards, train
continues from its last checkpoint with `--resume`. The command (cli.py) only
picks which rows of PHASES to run; adding a phase is a function and a row.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from ..background import served
from ..checkpoint_layout import require_config, text_field
from ..config import load_config
from ..cpu_reference import smollm2
from ..cpu_reference.generated import PREPARE_KIND
from ..errors import TrainConfigError
from ..fsio import write_text_atomic
from ..logtail import Log
from ..prepare import prepare
from . import device
from .config import TrainConfig
from .data import SELFSYNTH, RecordWriter, load_prompts, read_records, selfsynth_records
from .engines import PhaseArgs, engine_for, method_for
from .manifest import Manifest
from .regen import regen
from .regen_hf import regen_hf
from .target import load_tokenizer, target_info


def phase_setup(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    """Check the target against the drafter shape, write the prompt list and start the manifest.

    The target's numbers are its text model's (checkpoint_layout.text_field: Kimi K2.6 nests them
    under text_config), and its tokenizer is loaded as the serve config says (target.load_tokenizer)."""
    info = target_info(cfg)
    target = Path(info.model_dir)
    if info.prepare == "smollm2":
        smollm2.ensure(target, log=log)
    elif info.prepare in PREPARE_KIND:  # a generated pair: made by serve's own step (venv, generator)
        prepare(load_config(cfg.target.serve_config, cfg.target.serve_overrides), log=log)
    tconf = require_config(target, "target checkpoint", TrainConfigError)
    vocab, hidden, layers = (text_field(tconf, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers"))
    if not all(isinstance(v, int) for v in (vocab, hidden, layers)):
        raise TrainConfigError(
            f"{target}/config.json: no vocab_size, hidden_size and num_hidden_layers at the top "
            "level or under text_config"
        )
    tok = load_tokenizer(info)
    drafter, mask = method_for(cfg).check_drafter(cfg, tconf, tok)
    engine_for(cfg).check(cfg)  # refused before hours of regen, not at the first step
    prompts = load_prompts(cfg.data.prompts, cfg.seed, evaluation_only=evaluation_only(cfg))
    run.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(run).free / 2**30
    if free < cfg.data.min_free_disk_gb:
        raise TrainConfigError(f"{run}: {free:.1f} GiB free, config asks for {cfg.data.min_free_disk_gb}")
    write_text_atomic(run / "prompts.jsonl", "".join(json.dumps(p) + "\n" for p in prompts))
    Manifest.open(run).set_setup(cfg, drafter, target, mask, len(prompts))
    log(
        f"setup: run folder {run}; {len(prompts)} prompts; target {target}; "
        + (f"mask token {mask['id']} ({mask['token']!r}); " if mask else f"{cfg.train.method} drafter; ")
        + f"{free:.0f} GiB free"
    )


class _RegenOptions(TypedDict):
    """regen()'s keyword options, as phase_regen passes them."""

    concurrency: int
    max_tokens: int
    temperature: float
    seed: int
    limit: int | None


def _copy_selfsynth(spec: str, out: Path, have: set[str], wanted: set[str]) -> set[str]:
    """Append the records of every `selfsynth:DIR` part of data.prompts that the run wants and lacks;
    return their ids."""
    recs = [
        r
        for part in spec.split("+")
        if part.strip().startswith(SELFSYNTH)
        for r in selfsynth_records(part.strip())
        if r.id in wanted and r.id not in have
    ]
    if recs:
        writer = RecordWriter(out)
        writer.write_many(recs)
        writer.close()
    return {r.id for r in recs}


def phase_regen(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    """The target's own answers to the prompts (served by the recipe or at regen.base_url, or regen.source=hf)."""
    prompts = [json.loads(line) for line in (run / "prompts.jsonl").read_text().splitlines() if line.strip()]
    r = cfg.regen
    if r.records:
        prompts = prompts[: r.records]
    info = target_info(cfg)
    kw = _RegenOptions(
        concurrency=r.concurrency,
        max_tokens=r.max_tokens,
        temperature=r.temperature,
        seed=cfg.seed,
        limit=args.regen_limit,
    )
    out = run / "regen.jsonl"
    have = {x.id for x in read_records(out)}
    copied = _copy_selfsynth(cfg.data.prompts, out, have, {p["id"] for p in prompts})
    if copied:
        log(f"regen: {len(copied)} self-synthesised records copied (answered by the target when they were written)")
        have |= copied
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
            n = regen_hf(
                info.model_dir,
                todo,
                out,
                batch=r.concurrency,
                max_tokens=r.max_tokens,
                temperature=r.temperature,
                device=dev,
                trust_remote_code=info.trust_remote_code,
            )
        elif r.base_url:
            n = regen(r.base_url.rstrip("/").removesuffix("/v1"), info.served_name, prompts, out, **kw)
        else:
            if not cfg.target.serve_config:
                raise TrainConfigError(f"{cfg.path}: regen.source=server needs target.serve_config or regen.base_url")
            log(f"regen: starting the target with {cfg.target.serve_config} {cfg.target.serve_overrides}")
            with served(cfg.target.serve_config, cfg.target.serve_overrides, run / "regen-server.log") as base:
                n = regen(base, info.served_name, prompts, out, **kw)
    finally:  # an interrupted regen keeps its whole batches or records: the manifest counts them too
        Manifest.open(run).note_regen(out, {**r.as_dict(), **where})
    log(f"regen: {n} new records in {out}")


def phase_capture(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    log(f"capture: {engine_for(cfg).capture(cfg, run, log)}")


def evaluation_only(cfg: TrainConfig) -> bool:
    """data.heldout_fraction = 1: every record is held out, the run only measures drafters (`eval --drafter`)."""
    return cfg.data.heldout_fraction >= 1.0


def phase_train(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    if evaluation_only(cfg):
        raise TrainConfigError(
            f"{cfg.path}: data.heldout_fraction is 1, an evaluation-only run: nothing to "
            "train on (measure a drafter with `eval --drafter DIR`)"
        )
    engine_for(cfg).train(cfg, run, args, log)


def phase_eval(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    """The checkpoint's offline acceptance (noted in the manifest), or an exported drafter's (--drafter)."""
    engine_for(cfg).evaluate(cfg, run, args, log)


def phase_export(cfg: TrainConfig, run: Path, args: PhaseArgs, log: Log = print) -> None:
    log(f"export: {engine_for(cfg).export(cfg, run, log)}")


PhaseFn = Callable[[TrainConfig, Path, PhaseArgs, Log], None]
PHASES: dict[str, PhaseFn] = {
    "setup": phase_setup,
    "regen": phase_regen,
    "capture": phase_capture,
    "train": phase_train,
    "eval": phase_eval,
    "export": phase_export,
}
