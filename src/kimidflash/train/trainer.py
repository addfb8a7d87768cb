"""train: the DFlash objective on captured target features, resumable and DDP-ready.

* Loss: weighted cross-entropy of slot k's logits against x_{a+k}, weight
  exp(-(k-1)/gamma), averaged over counted slots (objective.py).
* On the GPU when torch sees one, else the CPU (train.device, device.py);
  bf16 autocast on the GPU by default (fp32 master weights, AdamW, warm-up
  then cosine).
* Checkpoints are written atomically (temp file + rename) every
  `checkpoint_every` steps and at the end, with the model, optimizer,
  scheduler, step, loss history and every RNG (torch, python, the data
  generator), so `--resume` continues exactly: an interrupted run resumed
  gives the same weights as an uninterrupted one (tested).
* Data parallel: under torchrun (WORLD_SIZE > 1) each rank draws its own
  batches from a rank-offset generator, gradients are averaged by DDP
  (gloo on CPU, nccl/rccl on GPUs, each rank on its LOCAL_RANK's GPU), and
  only rank 0 writes checkpoints.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import TrainConfigError
from ..formats.drafter import DrafterShape
from ..fsio import write_text_atomic
from ..logtail import Log
from . import device as dev
from . import objective as obj
from . import vocab
from .batch import Batch, collate
from .capture import (
    HFCapture,
    MemoryStore,
    SequenceStore,
    ShardStore,
    StreamStore,
    check_mode,
    make_source,
    note_capture,
    training_records,
)
from .config import TrainConfig, TrainOptions
from .distill import soft_cross_entropy
from .manifest import Manifest, portable_train
from .model import DFlashDrafter
from .progress import bar
from .select import WalkSelect
from .target import target_info
from .target_weights import load_target_head
from .warmstart import drafter_tensors, target_layer_tensors


def build_model(
    shape: DrafterShape | dict[str, Any], embed: torch.Tensor, head: torch.Tensor, seed: int, std: float
) -> DFlashDrafter:
    model = DFlashDrafter(shape, embed, head)
    model.init_weights(std, torch.Generator().manual_seed(seed))
    return model


def batch_loss(
    model: DFlashDrafter,
    b: Batch,
    weights: torch.Tensor,
    fwd: torch.nn.Module | None = None,
    frequent: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted CE over counted slots; the LM head runs only on those rows (it dominates the cost).

    `fwd`: the DDP-wrapped forward when data-parallel (gradients are then averaged across ranks).
    `frequent`: train.vocab_subset's token ids; the softmax then runs over them and the batch's labels
    (and, when the batch carries the target's top-k, those tokens too).
    A batch with soft targets (train.distill) is scored against them instead of the greedy label."""
    h = (
        fwd(b.feats, b.block_ids, b.block_pos, b.mask)
        if fwd is not None
        else model.hidden(b.feats, b.block_ids, b.block_pos, b.mask)
    )
    sel = b.label_ok
    if not sel.any():
        return h.sum() * 0.0, {"tokens": 0.0, "acc1": float("nan")}
    rows = h[sel]
    labels = b.labels[sel]
    soft = None if b.soft_ids is None else b.soft_ids[sel]
    needed = labels if soft is None else torch.cat([labels, soft.flatten()])
    ids = None if frequent is None else vocab.step_vocab(frequent, needed)
    logits = model.logits(rows, ids).float()
    target = labels if ids is None else vocab.subset_targets(ids, labels)
    slot = b.slot.expand_as(sel)[sel]
    w = weights[slot]
    if soft is None:
        ce = F.cross_entropy(logits, target, reduction="none")
    else:
        assert b.soft_logp is not None, "collate sets soft_logp with soft_ids"
        cols = soft if ids is None else vocab.subset_targets(ids, soft.flatten()).view_as(soft)
        ce = soft_cross_entropy(logits, cols, b.soft_logp[sel])
    loss = (ce * w).sum() / w.sum()
    with torch.no_grad():
        hit = logits.argmax(-1) == target
        first = slot == 1
        acc1 = hit[first].float().mean().item() if first.any() else float("nan")
    return loss, {"tokens": float(sel.sum()), "acc1": acc1, "vocab": float(logits.shape[-1])}


class _Forward(torch.nn.Module):
    """DDP needs forward(); route it to hidden()."""

    def __init__(self, m: DFlashDrafter):
        super().__init__()
        self.m = m

    def forward(self, feats: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.m.hidden(feats, ids, pos, mask)


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def sample_batch(
    store: SequenceStore,
    n: int,
    gen: torch.Generator,
    anchors_per_seq: int,
    block_size: int,
    mask_id: int,
    distill: bool = False,
) -> Batch:
    idx = torch.randint(len(store), (n,), generator=gen).tolist()
    many = getattr(store, "get_many", None)
    seqs = many(idx) if many else [store.get(i) for i in idx]
    items = []
    for ids, lm, f in seqs:
        a, v = obj.sample_anchors(lm, anchors_per_seq, gen)
        items.append((ids, lm, f, a, v))
    if not distill:
        return collate(items, block_size, mask_id, None)
    assert isinstance(store, ShardStore), "train.distill reads the top-k tables of cached shards (_train_store)"
    return collate(items, block_size, mask_id, [store.topk(i) for i in idx])


@dataclass
class _Run:
    """Everything a training step changes, and what a checkpoint saves and restores."""

    shape: DrafterShape
    tc: TrainOptions
    model: DFlashDrafter
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    gen: torch.Generator
    rank: int
    world: int
    device: torch.device
    step: int = 0
    history: list[dict[str, float | None]] = field(default_factory=list)  # vocab: None on a step with no tokens


def _start(
    shape: DrafterShape,
    tc: TrainOptions,
    embed: torch.Tensor,
    head: torch.Tensor,
    seed: int,
    init: dict[str, torch.Tensor] | None = None,
) -> _Run:
    """A fresh model (its layers seeded from `init` when given: warmstart.py), optimizer,
    schedule and this rank's data generator."""
    device = dev.resolve(tc.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rank, world = dev.init_distributed(device)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    model = build_model(shape, embed, head, seed, tc.init_std)
    if init:
        unexpected = model.load_state_dict(init, strict=False).unexpected_keys
        if unexpected:
            raise TrainConfigError(f"train.init_from_*: the drafter has no parameter {unexpected[0]}")
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, tc.warmup_steps, tc.steps, tc.min_lr_ratio))
    gen = torch.Generator().manual_seed(seed * 1000 + 17 + rank)
    return _Run(shape, tc, model, params, opt, sched, gen, rank, world, device)


def _restore(r: _Run, last: Path, log: Log) -> None:
    """Continue exactly where the checkpoint stopped: weights, optimizer, schedule and every RNG."""
    st = dev.load_to_cpu(last)
    r.model.load_state_dict(st["model"], strict=True)
    r.opt.load_state_dict(st["optimizer"])
    r.sched.load_state_dict(st["scheduler"])
    gens = st["rng"]["data"]
    r.gen.set_state(gens[r.rank] if r.rank < len(gens) else gens[0])
    torch.set_rng_state(st["rng"]["torch"])
    random.setstate(st["rng"]["python"])
    r.step, r.history = st["step"], st["history"]
    log(f"train: resumed at step {r.step} from {last}")


def _save(r: _Run, last: Path) -> None:
    """Every rank takes part in gathering the data generators; only rank 0 writes."""
    gens = [r.gen.get_state()]
    if r.world > 1:
        allg: list[Any] = [None] * r.world
        torch.distributed.all_gather_object(allg, r.gen.get_state())
        gens = allg
    if r.rank != 0:
        return
    dev.atomic_save(
        {
            "model": r.model.state_dict(),
            "optimizer": r.opt.state_dict(),
            "scheduler": r.sched.state_dict(),
            "step": r.step,
            "history": r.history,
            "shape": r.shape.as_dict(),
            "train_config": r.tc.as_dict(),
            "rng": {"data": gens, "torch": torch.get_rng_state(), "python": random.getstate()},
        },
        last,
    )


def _step(
    r: _Run,
    store: SequenceStore,
    weights: torch.Tensor,
    fwd: torch.nn.Module | None,
    frequent: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One optimizer step on a fresh batch; appends to the history."""
    tc = r.tc
    b = sample_batch(store, tc.batch_size, r.gen, tc.anchors_per_seq, tc.block_size, r.shape.mask_token_id, tc.distill)
    with dev.autocast(r.device, tc.autocast):
        loss, info = batch_loss(r.model, b.to(r.device), weights, fwd, frequent)
    r.opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(r.params, tc.grad_clip) if tc.grad_clip else torch.tensor(0.0)
    r.opt.step()
    r.sched.step()
    r.step += 1
    r.history.append(
        {
            "step": r.step,
            "loss": round(loss.item(), 5),
            "acc1": round(info["acc1"], 4),
            "lr": r.sched.get_last_lr()[0],
            "grad_norm": round(float(gn), 4),
            "vocab": info.get("vocab"),
        }
    )
    return loss, info


def train_loop(
    shape: DrafterShape | dict[str, Any],
    tc: TrainOptions | dict[str, Any],
    store: SequenceStore,
    embed: torch.Tensor,
    head: torch.Tensor,
    ckpt_dir: Path,
    seed: int,
    resume: bool,
    stop_at: int | None = None,
    log: Log = print,
    progress: bool = True,
    frequent: torch.Tensor | None = None,
    init: dict[str, torch.Tensor] | None = None,
    max_seconds: float | None = None,
    select: Callable[[DFlashDrafter, int, int], float | None] | None = None,
) -> dict[str, Any]:
    """Train to tc.steps (or stop at `stop_at`, or at the first step that ends after
    `max_seconds`, a wall-clock chunk); returns the final state summary. `select` (select.py)
    runs on rank 0 after each step; what it returns goes into that step's history."""
    shape, tc = DrafterShape.coerce(shape), TrainOptions.coerce(tc)
    r = _start(shape, tc, embed, head, seed, init)
    weights = obj.loss_weights(tc.block_size, tc.gamma).to(r.device)
    frequent = None if frequent is None else frequent.to(r.device)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    last = ckpt_dir / "last.pt"
    if resume and last.is_file():
        _restore(r, last, log)
    ids = [r.device.index] if r.device.type == "cuda" else None
    fwd = torch.nn.parallel.DistributedDataParallel(_Forward(r.model), device_ids=ids) if r.world > 1 else None
    end = tc.steps if stop_at is None else min(tc.steps, stop_at)
    t0 = time.monotonic()
    with bar("train", tc.steps, start=r.step) as advance:
        while r.step < end:
            loss, info = _step(r, store, weights, fwd, frequent)
            walk = select(r.model, r.step, end) if select is not None and r.rank == 0 else None
            if walk is not None:
                r.history[-1]["select_walk"] = walk
            if progress:
                advance(loss=f"{loss.item():.3f}", acc1=f"{info['acc1']:.2f}")
            out_of_time = max_seconds is not None and time.monotonic() - t0 >= max_seconds
            if r.step % tc.checkpoint_every == 0 or r.step == end or out_of_time:
                _save(r, last)
            if out_of_time:
                break
    if r.world > 1:
        # Rank 0 is still writing the checkpoint when the others return from _save; a rank
        # that tears gloo down meanwhile aborts its peer ("terminate called without an active exception").
        torch.distributed.barrier()
    return {"model": r.model, "step": r.step, "history": r.history, "seconds": time.monotonic() - t0}


def _train_store(
    cfg: TrainConfig, run: Path, shape: DrafterShape, model_dir: str, log: Log = print
) -> ShardStore | StreamStore | MemoryStore:
    """Captured shards (cache mode), features computed per batch (stream mode) or captured once
    into the train device's memory (memory mode)."""
    mode = check_mode(cfg)
    if mode == "cache":
        store: ShardStore | StreamStore | MemoryStore = ShardStore(run / "capture", "train")
    else:
        train_recs, held = training_records(cfg, run)
        note_capture(cfg, run, train_recs, held)
        source = make_source(cfg, model_dir, shape.target_layer_ids)
        if mode == "stream":
            store = StreamStore(train_recs, source)
        elif not isinstance(source, HFCapture):
            raise TrainConfigError(
                f"{cfg.path}: capture.mode=memory needs capture.source=hf (the target on the "
                "train device); with a served target use stream or cache"
            )
        else:
            store = MemoryStore(train_recs, source, cfg.capture.shard_records, log=log)
    if not len(store):
        raise TrainConfigError(f"{run}: no captured training records; run the capture phase")
    if cfg.train.distill and not (isinstance(store, ShardStore) and store.has_topk):
        raise TrainConfigError(
            f"{cfg.path}: train.distill needs the target's top-k captured in cache mode: set "
            "capture.topk (e.g. 8) and capture.mode=cache, then run the capture phase"
        )
    return store


def train(
    cfg: TrainConfig,
    run: Path,
    resume: bool,
    stop_at: int | None = None,
    log: Log = print,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    shape, tc = cfg.shape(), cfg.train
    infer_block = cfg.export.block_size or shape.block_size
    if tc.block_size < infer_block:
        raise TrainConfigError(
            f"train.block_size {tc.block_size} < the served block size {infer_block} "
            "(set export.block_size to serve smaller blocks)"
        )
    model_dir = target_info(cfg).model_dir
    store = _train_store(cfg, run, shape, model_dir, log=log)
    embed, head = load_target_head(model_dir)
    if not resume and (run / "checkpoints" / "last.pt").is_file():
        raise TrainConfigError(f"{run / 'checkpoints' / 'last.pt'} exists: pass --resume to continue it, or remove it")
    frequent = vocab.frequent_tokens(training_records(cfg, run)[0], tc.vocab_subset) if tc.vocab_subset else None
    init: dict[str, torch.Tensor] = {}
    if tc.init_from_target and not resume:
        init.update(target_layer_tensors(model_dir, tc.init_from_target, shape))
        log(f"train: draft layers start from target layers {tc.init_from_target}")
    if tc.init_from_drafter and not resume:
        init.update(drafter_tensors(tc.init_from_drafter, shape))  # over the target's layers where both give one
        log(f"train: starts from the drafter in {tc.init_from_drafter}")
    res = train_loop(
        shape,
        tc,
        store,
        embed,
        head,
        run / "checkpoints",
        cfg.seed,
        resume,
        stop_at,
        log=log,
        frequent=frequent,
        init=init,
        max_seconds=max_seconds,
        select=WalkSelect.for_run(cfg, run, resume, log),
    )
    hist = res["history"]
    tail = hist[-50:]
    res["loss_mean_last50"] = sum(h["loss"] for h in tail) / max(1, len(tail))
    where = dev.resolve(tc.device)
    m = Manifest.open(run)
    m.note(
        "train",
        {
            "steps_done": res["step"],
            "steps_planned": tc.steps,
            "records": len(store),
            "examples_seen": res["step"] * tc.batch_size,
            "final_loss_mean_last50": res["loss_mean_last50"],
            "config": portable_train(tc),
            # what train.autocast "auto" meant on this machine (device.native_bf16)
            "bf16_autocast": dev.autocast_enabled(where, tc.autocast),
            "device": dev.describe(where),
            "chunk_seconds": round(res["seconds"], 1),
        },
    )
    write_text_atomic(run / "loss-history.json", json.dumps(hist) + "\n")
    log(f"train: step {res['step']}/{tc.steps}, mean loss of the last {len(tail)} steps {res['loss_mean_last50']:.3f}")
    return res
