"""`python -m kimidflash.train CONFIG [phases] [--skip-setup] [--skip-regen] [--resume]`.

Phases, in order: setup, regen, capture, train, eval, export. Each one reads
what the previous wrote in the run folder and is resumable: regen skips
answered prompts, capture skips written shards, train continues from its last
checkpoint with `--resume`. train-drafter.sh is a thin wrapper over this.
Exit status: 0 done, 2 bad input (one line naming the culprit), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ..paths import portable_argv
from . import config as tcfg
from .manifest import Manifest

PHASES = ("setup", "regen", "capture", "train", "eval", "export")


def target_info(cfg: dict[str, Any]) -> dict[str, Any]:
    """Target dir, served name and prepare mode, from the serve config (or target.model_dir)."""
    info: dict[str, Any] = {"model_dir": cfg["target"]["model_dir"], "served_name": cfg["regen"]["model"],
                            "prepare": "none"}
    sc = cfg["target"]["serve_config"]
    if sc:
        from ..config import load_config, parse_overrides

        env = load_config(sc, parse_overrides(cfg["target"]["serve_overrides"]))
        info["model_dir"] = info["model_dir"] or str(env["MODEL_DIR"])
        info["served_name"] = info["served_name"] or env["SERVED_MODEL_NAME"]
        info["prepare"] = env["PREPARE_MODELS"]
    if not info["model_dir"]:
        raise tcfg.TrainConfigError(f"{cfg['_path']}: set target.serve_config or target.model_dir")
    return info


def phase_setup(cfg: dict[str, Any], run: Path, log=print) -> Manifest:
    from .data import load_prompts

    shape = tcfg.drafter_shape(cfg)
    info = target_info(cfg)
    target = Path(info["model_dir"])
    if info["prepare"] == "smollm2":
        from . import smollm2

        smollm2.ensure(target, log=log)
    if not (target / "config.json").is_file():
        raise tcfg.TrainConfigError(f"target checkpoint not found: {target}/config.json")
    tconf = json.loads((target / "config.json").read_text())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    mask = shape["dflash_config"]["mask_token_id"]
    if not 0 <= mask < tconf["vocab_size"]:
        raise tcfg.TrainConfigError(f"{cfg['drafter_config']}: mask_token_id {mask} outside the target's vocab")
    if shape["vocab_size"] != tconf["vocab_size"] or shape["hidden_size"] != tconf["hidden_size"]:
        raise tcfg.TrainConfigError(f"{cfg['drafter_config']}: vocab/hidden {shape['vocab_size']}/{shape['hidden_size']}"
                                    f" differ from the target's {tconf['vocab_size']}/{tconf['hidden_size']}")
    if max(shape["dflash_config"]["target_layer_ids"]) >= tconf["num_hidden_layers"] - 1:
        raise tcfg.TrainConfigError(f"{cfg['drafter_config']}: a target_layer_id reaches the target's last layer")
    prompts = load_prompts(cfg["data"]["prompts"], cfg["seed"])
    run.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(run).free / 2**30
    if free < cfg["data"]["min_free_disk_gb"]:
        raise tcfg.TrainConfigError(f"{run}: {free:.1f} GiB free, config asks for {cfg['data']['min_free_disk_gb']}")
    (run / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    m = Manifest.open(run)
    m.set_setup(cfg, shape, target, tok.convert_ids_to_tokens(mask), len(prompts))
    log(f"setup: run folder {run}; {len(prompts)} prompts; target {target}; mask token {mask} "
        f"({tok.convert_ids_to_tokens(mask)!r}); {free:.0f} GiB free")
    return m


def phase_regen(cfg: dict[str, Any], run: Path, limit: int | None, log=print) -> None:
    from .regen import regen
    from ..background import served

    prompts = [json.loads(l) for l in (run / "prompts.jsonl").read_text().splitlines() if l.strip()]
    if cfg["regen"]["records"]:
        prompts = prompts[: cfg["regen"]["records"]]
    info = target_info(cfg)
    r = cfg["regen"]
    kw = dict(concurrency=r["concurrency"], max_tokens=r["max_tokens"], temperature=r["temperature"],
              seed=cfg["seed"], limit=limit)
    out = run / "regen.jsonl"
    from .data import read_records

    if len({x.id for x in read_records(out)} & {p["id"] for p in prompts}) == len(prompts):
        log("regen: every prompt already answered")
        return
    if r["base_url"]:
        n = regen(r["base_url"].rstrip("/").removesuffix("/v1"), info["served_name"], prompts, out, **kw)
    else:
        log(f"regen: starting the target with {cfg['target']['serve_config']} {cfg['target']['serve_overrides']}")
        with served(cfg["target"]["serve_config"], cfg["target"]["serve_overrides"], run / "regen-server.log") as base:
            n = regen(base, info["served_name"], prompts, out, **kw)
    Manifest.open(run).note_regen(out, r)
    log(f"regen: {n} new records in {out}")


def phase_capture(cfg: dict[str, Any], run: Path, log=print) -> None:
    from .capture import capture_shards

    if cfg["capture"]["mode"] == "stream":
        log("capture: mode=stream, hidden states are computed during training (nothing cached)")
        return
    n = capture_shards(cfg, run, log=log)
    log(f"capture: {n} shards in {run / 'capture'}")


def phase_train(cfg: dict[str, Any], run: Path, resume: bool, max_steps: int | None, log=print) -> None:
    from .trainer import train

    train(cfg, run, resume=resume, stop_at=max_steps, log=log)


def phase_eval(cfg: dict[str, Any], run: Path, log=print) -> None:
    from .evaluate import evaluate_run

    res = evaluate_run(cfg, run, log=log)
    Manifest.open(run).note_eval(res)


def phase_export(cfg: dict[str, Any], run: Path, log=print) -> None:
    from .export import export_run

    out = export_run(cfg, run, log=log)
    log(f"export: {out}")


def _record_invocation(run: Path, invocation: dict[str, Any]) -> None:
    """Every command run on this folder, in order: the manifest says how to reproduce the drafter."""
    from datetime import datetime, timezone

    m = Manifest.open(run)
    invocation = dict(invocation, utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    m.data.setdefault("invocations", []).append(invocation)
    m.save()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="train-drafter", description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", default=str(Path(__file__).resolve().parents[3] / "configs" / "train-cpu-reference.json"))
    p.add_argument("phases", nargs="*", help=f"subset of {', '.join(PHASES)} (default: all)")
    p.add_argument("--skip-setup", action="store_true")
    p.add_argument("--skip-regen", action="store_true")
    p.add_argument("--resume", action="store_true", help="continue training from the run's last checkpoint")
    p.add_argument("--max-steps", type=int, help="stop training after this global step (a chunk); resume later")
    p.add_argument("--regen-limit", type=int, help="answer at most this many new prompts (a chunk)")
    p.add_argument("--run-dir", help="override the run folder")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. train.steps=50")
    a = p.parse_intermixed_args(argv)  # phases may come after options
    try:
        over = tcfg.parse_set(a.set)
        if a.run_dir:
            over["run_dir"] = os.path.abspath(a.run_dir)
        cfg = tcfg.load(a.config, over)
        bad = [x for x in a.phases if x not in PHASES]
        if bad:
            raise tcfg.TrainConfigError(f"unknown phase '{bad[0]}' (phases: {', '.join(PHASES)})")
        phases = [x for x in PHASES if (not a.phases or x in a.phases)]
        if a.skip_setup:
            phases = [x for x in phases if x != "setup"]
        if a.skip_regen:
            phases = [x for x in phases if x != "regen"]
        run = Path(cfg["run_dir"])
        if phases and phases[0] != "setup" and not (run / "manifest.json").is_file():
            raise tcfg.TrainConfigError(f"{run}: no manifest.json; run the setup phase first")
        invocation = {"argv": portable_argv(["./train-drafter.sh", *(argv if argv is not None else sys.argv[1:])]),
                      "phases": phases}
        for ph in phases:
            if ph == "setup":
                phase_setup(cfg, run)
            if ph == phases[0]:
                _record_invocation(run, invocation)
            if ph == "regen":
                phase_regen(cfg, run, a.regen_limit)
            elif ph == "capture":
                phase_capture(cfg, run)
            elif ph == "train":
                phase_train(cfg, run, a.resume, a.max_steps)
            elif ph == "eval":
                phase_eval(cfg, run)
            elif ph == "export":
                phase_export(cfg, run)
    except (tcfg.TrainConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun with --resume (training) or the same command (other phases)", file=sys.stderr)
        return 130
    return 0
