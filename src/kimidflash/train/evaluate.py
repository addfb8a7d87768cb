"""eval: offline acceptance length, teacher-forced, per position.

For every anchor a in a held-out response whose next k tokens are all
response tokens, the drafter gets the target's hidden states before a and a
block of 1 + k slots (the anchor token and k mask tokens: exactly what vLLM
queries per draft step at num_speculative_tokens = k), predicts greedily, and
is compared with the target's own greedy continuation x_{a+1..a+k} (the regen
records were generated at temperature 0). Acceptance length = 1 + the leading
run of matches (the bonus token always counts), as seed 001 and speculators'
"eal" define it; `per_position[i]` is the fraction of drafts whose first i+1
tokens all match, the same cumulative form as vLLM's
`spec_decode_num_accepted_tokens_per_pos`.

That average weighs every anchor once; a server does not. It drafts at the
first response token, accepts n, and drafts next at the token after the
bonus, so where the drafter fails it drafts more often. `walk` replays that
walk over the same teacher-forced lengths: its mean is the acceptance length
a server would report on the same text, the figure to compare with /metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..checkpoint_layout import require_config
from ..errors import TrainConfigError
from ..formats.drafter import DrafterShape
from ..fsio import write_json_atomic
from ..logtail import Log
from ..paths import portable
from . import device as dev
from .batch import collate
from .capture import SequenceStore, ShardStore, StreamStore, check_mode, opened_source, training_records
from .config import TrainConfig
from .draft_vocab import draft_vocab_ids
from .model import DFlashDrafter
from .progress import bar
from .target import target_info
from .target_weights import load_target_head
from .warmstart import drafter_tensors


def acceptance_lengths(pred: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """[N, k] predictions and truths -> [N] lengths 1 + leading matches."""
    hit = (pred == truth).long()
    return 1 + hit.cumprod(dim=1).sum(dim=1)


def summarize(lengths: torch.Tensor, k: int) -> dict[str, Any]:
    n = len(lengths)
    if n == 0:
        return {"k": k, "drafts": 0, "mean_acceptance_length": None, "per_position": [None] * k}
    acc = lengths - 1
    return {
        "k": k,
        "drafts": n,
        "mean_acceptance_length": round(float(lengths.float().mean()), 4),
        "acceptance_rate": round(float(acc.float().mean() / k), 4),
        "per_position": [round(float((acc >= i + 1).float().mean()), 4) for i in range(k)],
    }


def walk(anchors: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The lengths a server would see: from the first anchor, each draft of length L
    moves the next draft L tokens on (L - 1 accepted plus the bonus), until an
    anchor without k response tokens after it."""
    at = {int(a): int(n) for a, n in zip(anchors, lengths, strict=False)}
    out: list[int] = []
    a = int(anchors[0]) if len(anchors) else 0
    while a in at:
        out.append(at[a])
        a += at[a]
    return torch.tensor(out, dtype=torch.long)


def eval_anchors(loss_mask: torch.Tensor, k: int) -> torch.Tensor:
    """Anchors whose next k positions exist and are all response tokens."""
    T = len(loss_mask)
    out = [a for a in range(T - k) if loss_mask[a] and bool(loss_mask[a + 1 : a + k + 1].all())]
    return torch.tensor(out, dtype=torch.long)


@torch.no_grad()
def offline_acceptance(
    model: DFlashDrafter,
    store: SequenceStore,
    k: int,
    max_records: int | None = None,
    chunk: int = 48,
    autocast: str = "none",
) -> dict[str, Any]:
    """Teacher-forced acceptance of `model` over `store` at k speculative tokens (block = 1 + k),
    on the model's device; `autocast` as train.autocast."""
    mask_id = model.shape.mask_token_id
    device = model.fc.weight.device
    B = k + 1
    lengths, walked = [], []
    n = len(store) if max_records is None else min(max_records, len(store))
    with bar(f"eval k={k}", n) as advance:
        for i in range(n):
            ids, lm, f = store.get(i)
            anchors = eval_anchors(lm, k)
            record = []
            for s in range(0, len(anchors), chunk):
                a = anchors[s : s + chunk]
                valid = torch.ones(len(a), dtype=torch.bool)
                b = collate([(ids, lm, f, a, valid)], B, mask_id).to(device)
                with dev.autocast(device, autocast):
                    h = model.hidden(b.feats, b.block_ids, b.block_pos, b.mask)
                    pred = model.predict(h[0].view(len(a), B, -1)[:, 1:])
                truth = b.labels[0].view(len(a), B)[:, 1:]
                record.append(acceptance_lengths(pred, truth).cpu())
            if record:
                lengths.append(torch.cat(record))
                walked.append(walk(anchors, lengths[-1]))
            advance()
    empty = torch.zeros(0, dtype=torch.long)
    return {
        **summarize(torch.cat(lengths) if lengths else empty, k),
        "walk": summarize(torch.cat(walked) if walked else empty, k),
    }


def checkpoint_path(run: Path) -> Path:
    """The checkpoint whose weights a run measures and exports: best.pt where train.select_every kept
    one (select.py), else last.pt."""
    best = run / "checkpoints" / "best.pt"
    return best if best.is_file() else run / "checkpoints" / "last.pt"


def checkpoint_state(run: Path) -> dict[str, Any]:
    """last.pt (shape, history, options), its weights and step replaced by best.pt's where there is one."""
    st = dev.load_to_cpu(run / "checkpoints" / "last.pt")
    if checkpoint_path(run).name == "best.pt":
        best = dev.load_to_cpu(checkpoint_path(run))
        st = {**st, "model": best["model"], "step": best["step"], "walk": best["walk"]}
    return st


def load_checkpoint_model(run: Path, model_dir: str | Path) -> tuple[DFlashDrafter, dict[str, Any]]:
    """The drafter of the run's checkpoint (checkpoint_state; its shape is the one recorded there) on
    the CPU, and the checkpoint."""
    st = checkpoint_state(run)
    embed, head = load_target_head(model_dir)
    model = DFlashDrafter(st["shape"], embed, head)
    model.load_state_dict(st["model"])
    return model.eval(), st


def load_exported_model(drafter_dir: str | Path, model_dir: str | Path) -> DFlashDrafter:
    """An exported drafter (its config.json shape, its model.safetensors) with the target's embeddings
    and head, on the CPU: the same checks as train.init_from_drafter, so a mismatch names its key. A
    draft vocabulary limits its drafts to those tokens, scored by the same target head rows."""
    d = Path(drafter_dir)
    shape = DrafterShape.from_dict(
        require_config(d, "exported drafter config", TrainConfigError), str(d / "config.json")
    )
    model = DFlashDrafter(shape, *load_target_head(model_dir))
    model.load_state_dict(drafter_tensors(d, shape), strict=True)
    model.draft_ids = draft_vocab_ids(d)
    return model.eval()


def evaluate_run(
    cfg: TrainConfig,
    run: Path,
    log: Log = print,
    drafter: str | Path | None = None,
    result: str | None = None,
    checkpoint_run: Path | None = None,
) -> dict[str, Any]:
    """Offline acceptance of the run's last checkpoint (or `checkpoint_run`'s: another run's drafter on
    this run's records), or of an exported `drafter`, on the run's records.

    A drafter's result goes to `eval-<its folder name>.json` in the run, the checkpoint's to eval.json
    (`result` names another file: the speculators engine's checkpoint is measured exported)."""
    model_dir = target_info(cfg).model_dir
    if drafter is None:
        model, st = load_checkpoint_model(checkpoint_run or run, model_dir)
    else:
        model, st = load_exported_model(drafter, model_dir), {"step": None}
    block = cfg.train.block_size if drafter is None else model.shape.block_size  # what it was trained (exported) for
    too_long = [k for k in cfg.eval.k if k + 1 > block]
    if too_long:  # before any record is scored, so no k's result is computed and then lost
        raise TrainConfigError(
            f"eval.k {too_long[0]}: needs a block of {too_long[0] + 1} > the drafter's block size "
            f"{block} ({drafter if drafter is not None else checkpoint_path(checkpoint_run or run)})"
        )
    model.to(dev.resolve(cfg.train.device))
    split = cfg.eval.split
    if check_mode(cfg) == "cache":  # memory mode evaluates like stream: the held-out records are few
        res = _score(
            cfg, model, st, drafter, ShardStore(run / "capture", "train" if split == "train" else "heldout"), run, log
        )
    else:  # a served target (source=vllm without base_url) runs for the eval alone
        tr, held = training_records(cfg, run)
        with opened_source(cfg, run, model.shape.target_layer_ids) as source:
            res = _score(cfg, model, st, drafter, StreamStore(tr if split == "train" else held, source), run, log)
    result = result or ("eval.json" if drafter is None else f"eval-{Path(drafter).resolve().name}.json")
    write_json_atomic(run / result, res)
    return res


def _score(
    cfg: TrainConfig,
    model: DFlashDrafter,
    st: dict,
    drafter: str | Path | None,
    store: SequenceStore,
    run: Path,
    log: Log,
) -> dict[str, Any]:
    split = cfg.eval.split
    if not len(store):
        raise TrainConfigError(f"{run}: no {split} records captured")
    res = {
        "step": st["step"],
        **({"drafter": portable(drafter)} if drafter is not None else {}),
        "split": split,
        "records": min(len(store), cfg.eval.max_records),
        "definition": "teacher-forced against the target's greedy continuation; block = 1 + k; "
        "walk: only the anchors a server would draft at",
        "by_k": {},
    }
    for k in cfg.eval.k:
        r = offline_acceptance(model, store, k, cfg.eval.max_records, autocast=cfg.train.autocast)
        res["by_k"][str(k)] = r
        log(
            f"eval: k={k} offline mean acceptance length {r['mean_acceptance_length']} over {r['drafts']} drafts; "
            f"per position {r['per_position']}; as a server walks {r['walk']['mean_acceptance_length']}"
        )
    return res
