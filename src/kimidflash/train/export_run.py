"""The export phase: the run's last checkpoint as a drafter folder vLLM serves, with its provenance.

export.py writes the format; this adds what travels with it (the manifest,
the loss curve and history, offline acceptance when it was measured on this
very checkpoint, the held-out prompts to A/B it on, and a README generated
from those files only).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TrainConfigError
from ..formats.drafter import DrafterShape
from ..formats.drafter_export import export_model
from ..fsio import read_json_object
from ..logtail import Log
from .capture import training_records
from .config import TrainConfig
from .draft_vocab import FREQUENT, attach, choose, coverage, rule
from .evaluate import load_checkpoint_model
from .target import target_info


def loss_curve_png(history: list[dict[str, float]], path: Path, title: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = [h["step"] for h in history]
    loss = [h["loss"] for h in history]
    w = max(1, len(loss) // 50)
    smooth = [sum(loss[max(0, i - w + 1) : i + 1]) / len(loss[max(0, i - w + 1) : i + 1]) for i in range(len(loss))]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=90)
    ax.plot(steps, loss, lw=0.5, alpha=0.35, label="loss")
    ax.plot(steps, smooth, lw=1.5, label=f"moving mean ({w})")
    ax.set_xlabel("step")
    ax.set_ylabel("weighted CE")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def autocast_meant(train_note: dict[str, Any]) -> str:
    """What `auto` resolved to where the run trained, when the manifest says (runs from 2026-11-25)."""
    on = train_note.get("bf16_autocast")
    return "" if on is None else f" (= {'bf16' if on else 'fp32'} on the training machine)"


@dataclass(frozen=True)
class Family:
    """How an exported folder's README speaks of its drafter family: each family's export passes its own,
    so the README needs no branch on train.method."""

    name: str  # "a DFlash drafter"
    config_kind: str  # what drafter_config holds
    vllm_format: str
    per_batch: Callable[[dict[str, Any]], str]  # what one training row holds, from the train options


DFLASH = Family(
    "a DFlash drafter",
    "drafter shape",
    "DFlash",
    lambda tc: f"{tc['anchors_per_seq']} anchors, block {tc['block_size']}",
)


def drafter_readme(
    cfg: TrainConfig,
    manifest: dict[str, Any],
    st: dict[str, Any],
    ev: dict[str, Any] | None,
    family: Family = DFLASH,
) -> str:
    """A human summary written from the manifest and eval file only (no number typed by hand)."""
    origin = (manifest.get("target") or {}).get("origin") or {}
    cap = manifest.get("capture", {})
    tr = manifest.get("train", {})
    # what trained: the train phase's own options (its --set overrides included), not the export's
    tc = {**cfg.train.as_dict(), **(tr.get("config") or {})}
    loss = tr.get("final_loss_mean_last50")
    prompts = (manifest.get("prompts") or {}).get("source", cfg.data.prompts)  # setup's, not this phase's config
    lines = [
        f"# {cfg.name}: {family.name} trained by `./train-drafter.sh`",
        "",
        f"Target: `{(manifest.get('target') or {}).get('dir')}`" + (f" ({origin.get('note')})" if origin else ""),
        "",
        f"- {family.config_kind}: `{Path(cfg.drafter_config or '').name}`, exported "
        f"in vLLM's {family.vllm_format} format",
        f"- data: {cap.get('train_records')} regenerated training records ({cap.get('train_response_tokens')} "
        f"response tokens), {cap.get('heldout_records')} held out; prompts `{prompts}` "
        f"(seed {cfg.seed}), regen sampling {manifest.get('regen', {}).get('sampling')}",
        f"- training: {st['step']} steps of batch {tc['batch_size']} x {family.per_batch(tc)}"
        + f", gamma {tc['gamma']}, lr {tc['lr']}, autocast {tc['autocast']}{autocast_meant(tr)}; "
        "loss curve `loss-curve.png`, history `loss-history.json`",
        f"- final mean loss over the last 50 steps: {loss if loss is None else round(loss, 6)}",
    ]
    start = tc.get("init_from_drafter")
    if start:  # its earlier training is that drafter's own (its README), not in these figures
        lines.append(
            f"- started from the drafter in `{start}` (`train.init_from_drafter`), which brought its own "
            "training: the data and steps above are this run's only"
        )
    if ev:
        for k, r in ev["by_k"].items():
            walk = (r.get("walk") or {}).get("mean_acceptance_length")
            lines.append(
                f"- offline acceptance at k={k} ({ev.get('split', 'heldout')} split, {r['drafts']} drafts): "
                f"mean length {r['mean_acceptance_length']}, per position {r['per_position']}"
                + (f"; {walk} as a server walks (the figure to compare with vLLM's)" if walk else "")
            )
    argvs = [i["argv"] for i in manifest.get("invocations", [])]
    lines += [
        "",
        "Reproduce (every command run on the run folder, in order, is in `manifest.json` under `invocations`):",
        "",
        "```bash",
        *(" ".join(a) for a in argvs),
        "```",
        "",
    ]
    folders = list(dict.fromkeys(a[a.index("--run-dir") + 1] for a in argvs if "--run-dir" in a[:-1]))
    if len(folders) > 1:
        lines += [
            f"The run folder was copied between commands: the commands on `{folders[0]}` made it, and "
            f"those on {', '.join(f'`{f}`' for f in folders[1:])} continued a copy (the manifest, "
            "checkpoint, data and captured shards came with it).",
            "",
        ]
    return "\n".join(lines)


def export_run(cfg: TrainConfig, run: Path, log: Log = print) -> Path:
    if not cfg.export.out:
        raise TrainConfigError(f"{cfg.path}: export.out is not set")
    model, st = load_checkpoint_model(run, target_info(cfg).model_dir)
    manifest = read_json_object(run / "manifest.json", "run manifest", TrainConfigError)
    manifest["exported_from_step"] = st["step"]
    png = run / "loss-curve.png"
    loss_curve_png(st["history"], png, f"{cfg.name}: {st['step']} steps")
    extras = {"manifest.json": (json.dumps(manifest, indent=2) + "\n").encode()}
    if png.is_file():
        extras["loss-curve.png"] = png.read_bytes()
    ev = run / "eval.json"
    if ev.is_file() and read_json_object(ev, error=TrainConfigError).get("step") == st["step"]:
        extras["offline-acceptance.json"] = ev.read_bytes()  # measured on this very checkpoint
    hist = run / "loss-history.json"
    if hist.is_file():
        extras["loss-history.json"] = hist.read_bytes()
    held = training_records(cfg, run)[1]
    if held:  # the traffic to A/B the drafter on: prompts it never trained on
        extras["heldout-prompts.jsonl"] = "".join(
            json.dumps({"id": r.id, "prompt": r.prompt}) + "\n" for r in held
        ).encode()
    extras["README.md"] = drafter_readme(
        cfg, manifest, st, read_json_object(ev, error=TrainConfigError) if "offline-acceptance.json" in extras else None
    ).encode()
    shape = DrafterShape.coerce(st["shape"])
    if cfg.export.block_size:
        shape = shape.with_block_size(cfg.export.block_size)  # queries per draft step: serves k <= block_size - 1
    out = export_model(model.state_dict(), shape, Path(cfg.export.out), cfg.export.dtype, extras)
    n = cfg.export.draft_vocab_size
    if n:  # the head over the tokens these records' answers use most (draft_vocab.py); replaces the folder whole
        train = training_records(cfg, run)[0]
        ids = choose(train, n, shape.vocab_size)
        attach(
            out,
            target_info(cfg).model_dir,
            ids,
            out,
            {
                "rule": "export.draft_vocab_size: " + rule(FREQUENT, "the run's training records"),
                "record_count": len(train),
                "record_answer_coverage": coverage(train, ids),
            },
        )
        log(f"export: {out} drafts from {n} of {shape.vocab_size} tokens (export.draft_vocab_size)")
    return out
