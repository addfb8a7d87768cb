"""train.method eagle3 with our engine: train, eval and export an EAGLE-3 head on a run's shards.

* Data: the capture phase's shards (capture.mode cache), at the head's auxiliary layers
  (TrainConfig.capture_layer_ids): the same regenerated records a DFlash drafter trains on.
* Draft vocabulary: the head's `draft_vocab_size` tokens the training answers use most
  (draft_vocab.choose, all by frequency, then lowest ids), or, for a fine-tune, the vocabulary of
  the head it starts from. The LM head starts from the target's rows of those tokens.
* Objective: eagle3_ttt.ttt_loss over `train.ttt_steps` steps, step j weighted exp(-j / gamma).
* Fine-tune (`train.init_from_drafter`: an exported head): every tensor from it, and with
  `train.anchor_l2` > 0 a penalty anchor_l2 * |w - w_init|^2 summed over the weights, which keeps
  the fine-tune near what already drafts well on other traffic (seed 002's guard against
  over-specialising).
* Checkpoints: last.pt every `checkpoint_every` steps and at the end (model, optimizer, schedule,
  step, history, RNG: `--resume` continues exactly); with held-out records, the held-out loss at
  each checkpoint, and best.pt where it was lowest, or, with `train.select_every`, where the walk
  on the held-out records was longest (select.py, as a DFlash run). Eval and export take best.pt
  when there is one.
* Data-parallel under torchrun (WORLD_SIZE > 1): every rank a whole replica on its LOCAL_RANK's
  device drawing its own batches, gradients averaged by DDP; rank 0 measures the held-out loss and
  writes the checkpoints (with every rank's data generator). A one-layer head fits one device at
  Kimi size (plan_eagle3.py), so there is nothing to shard.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import TrainConfigError
from ..formats.eagle3_export import export_head
from ..fsio import read_json, read_json_object, write_json_atomic, write_text_atomic
from ..logtail import Log
from . import device as dev
from .capture import ShardStore, training_records
from .config import TrainConfig
from .draft_vocab import choose, coverage
from .eagle3_model import Eagle3Drafter
from .eagle3_ttt import draft_chains, ttt_loss
from .evaluate import acceptance_lengths, eval_anchors, summarize, walk
from .export_run import Family, drafter_readme, loss_curve_png
from .manifest import Manifest, portable_train
from .progress import bar
from .select import WalkSelect
from .target import target_info
from .target_weights import load_target_head
from .trainer import lr_lambda

EAGLE3 = Family(
    "an EAGLE-3 head",
    "head config",
    "EAGLE-3",
    lambda tc: (
        f"{tc['ttt_steps']} TTT steps ("
        + (
            f"the checkpoint that walked best on {tc['select_records']} held-out records kept"
            if tc.get("select_every")
            else "the checkpoint with the lowest held-out loss kept"
        )
        + ")"
    ),
)

Seq = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _stores(cfg: TrainConfig, run: Path) -> tuple[ShardStore, ShardStore | None]:
    if cfg.capture.mode != "cache":
        raise TrainConfigError(f"{cfg.path}: train.method eagle3 trains on captured shards: set capture.mode=cache")
    folder = run / "capture"
    if not (folder / "index.json").is_file():
        raise TrainConfigError(f"{folder}: no captured shards; run the capture phase")
    want = cfg.capture_layer_ids()
    have = read_json_object(folder / "index.json", "capture index", TrainConfigError).get("layer_ids")
    if have != want:
        raise TrainConfigError(
            f"{folder}: shards hold layers {have}, the head fuses {want} (aux ids - 1): capture again"
        )
    train, held = ShardStore(folder, "train"), ShardStore(folder, "heldout")
    if not len(train):
        raise TrainConfigError(f"{run}: no captured training records; run the capture phase")
    return train, (held if len(held) else None)


def pad(seqs: list[Seq]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens, loss masks [N, T], lengths [N], features [N, T, nH], right-padded with zeros."""
    T = max(len(s[0]) for s in seqs)
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    masks = torch.zeros(len(seqs), T, dtype=torch.long)
    feats = torch.zeros(len(seqs), T, seqs[0][2].shape[-1], dtype=torch.float32)
    for n, (ids, lm, f) in enumerate(seqs):
        tokens[n, : len(ids)], masks[n, : len(ids)], feats[n, : len(ids)] = ids, lm, f.float()
    return tokens, masks, torch.tensor([len(s[0]) for s in seqs]), feats


def _init_tensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    f = Path(path) / "model.safetensors"
    if not f.is_file():
        raise TrainConfigError(f"train.init_from_drafter: {f} not found (an exported EAGLE-3 head)")
    return {k: v.float() if k != "d2t" else v.long() for k, v in load_file(str(f)).items()}


def build(cfg: TrainConfig, run: Path) -> tuple[Eagle3Drafter, dict[str, torch.Tensor] | None]:
    """The head to train (seeded init, or the fine-tune's start) and the weights an anchor pulls toward."""
    head, tc = cfg.head(), cfg.train
    embed, target_head = load_target_head(target_info(cfg).model_dir)
    init = _init_tensors(tc.init_from_drafter) if tc.init_from_drafter else None
    if init is not None and "d2t" in init:
        ids = init["d2t"] + torch.arange(len(init["d2t"]))
    elif head.draft_vocab_size < head.vocab_size:
        ids = choose(training_records(cfg, run)[0], head.draft_vocab_size, head.vocab_size, frequent=1.0)
    else:
        ids = None
    model = Eagle3Drafter(head, embed, len(head.aux_ids or ()), ids)
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name == "lm_head.weight":
                p.copy_(target_head[model.draft_ids])
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * tc.init_std)
    if init is not None:
        missing = sorted(set(model.state_dict()) - set(init))
        extra = sorted(set(init) - set(model.state_dict()))
        if missing or extra:
            raise TrainConfigError(
                f"train.init_from_drafter {tc.init_from_drafter}: "
                + (f"has no {missing[0]}" if missing else f"has {extra[0]}, which this head lacks")
            )
        model.load_state_dict(init, strict=True)
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()} if init is not None and tc.anchor_l2 else None
    return model, anchor


def _t2d(model: Eagle3Drafter) -> torch.Tensor:
    t2d = torch.full((model.head.vocab_size,), -1, dtype=torch.long)
    t2d[model.draft_ids] = torch.arange(len(model.draft_ids))
    return t2d


class _Objective(torch.nn.Module):
    """The TTT loss as a module's forward(), which is what DDP averages gradients through."""

    def __init__(self, model: Eagle3Drafter, steps: int, gamma: float, t2d: torch.Tensor):
        super().__init__()
        self.model, self.steps, self.gamma = model, steps, gamma
        self.register_buffer("t2d", t2d, persistent=False)

    def forward(
        self, tokens: torch.Tensor, masks: torch.Tensor, lengths: torch.Tensor, feats: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return ttt_loss(self.model, tokens, masks, lengths, feats, self.steps, self.gamma, self.t2d)


def _loss(
    objective: torch.nn.Module, seqs: list[Seq], cfg: TrainConfig, device: torch.device
) -> tuple[torch.Tensor, dict[str, float]]:
    tokens, masks, lengths, feats = (t.to(device) for t in pad(seqs))
    with dev.autocast(device, cfg.train.autocast):
        return objective(tokens, masks, lengths, feats)


@torch.no_grad()
def heldout_loss(objective: _Objective, store: ShardStore, cfg: TrainConfig, device: torch.device) -> float:
    losses = [
        _loss(objective, [store.get(i) for i in range(s, min(s + 4, len(store)))], cfg, device)[0].item()
        for s in range(0, len(store), 4)
    ]
    return sum(losses) / len(losses)


def train(
    cfg: TrainConfig,
    run: Path,
    resume: bool,
    stop_at: int | None = None,
    log: Log = print,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    tc = cfg.train
    store, held = _stores(cfg, run)
    ckpt = run / "checkpoints"
    last, best_path = ckpt / "last.pt", ckpt / "best.pt"
    if not resume and last.is_file():
        raise TrainConfigError(f"{last} exists: pass --resume to continue it, or remove it")
    device = dev.resolve(tc.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rank, world = dev.init_distributed(device)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    model, anchor = build(cfg, run)
    model.to(device)
    select = WalkSelect.for_run(cfg, run, resume, log, measure=offline_acceptance)
    objective = _Objective(model, tc.ttt_steps, tc.gamma, _t2d(model)).to(device)
    ids = [device.index] if device.type == "cuda" else None
    fwd = torch.nn.parallel.DistributedDataParallel(objective, device_ids=ids) if world > 1 else objective
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, tc.warmup_steps, tc.steps, tc.min_lr_ratio))
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + 17 + rank)
    step, history, best = 0, [], float("inf")
    if resume and last.is_file():
        st = dev.load_to_cpu(last)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        gens = st["rng"]["data"] if isinstance(st["rng"]["data"], list) else [st["rng"]["data"]]
        gen.set_state(gens[rank] if rank < len(gens) else gens[0])
        torch.set_rng_state(st["rng"]["torch"])
        random.setstate(st["rng"]["python"])
        step, history, best = st["step"], st["history"], st["best_heldout_loss"]
        log(f"train: resumed at step {step} from {last}")
    ckpt.mkdir(parents=True, exist_ok=True)
    end = tc.steps if stop_at is None else min(tc.steps, stop_at)
    t0 = time.monotonic()
    with bar("train", tc.steps, start=step) as advance:
        while step < end:
            idx = torch.randint(len(store), (tc.batch_size,), generator=gen).tolist()
            loss, info = _loss(fwd, [store.get(i) for i in idx], cfg, device)
            if anchor is not None:
                loss = loss + tc.anchor_l2 * sum(
                    ((p - anchor[n].to(device)) ** 2).sum() for n, p in model.named_parameters()
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip) if tc.grad_clip else torch.tensor(0.0)
            opt.step()
            sched.step()
            step += 1
            row = {
                "step": step,
                "loss": round(loss.item(), 5),
                "acc1": round(info.get("acc0", float("nan")), 4),
                "lr": sched.get_last_lr()[0],
                "grad_norm": round(float(gn), 4),
            }
            walked = select(model, step, end) if select is not None and rank == 0 else None
            if walked is not None:
                row["select_walk"] = walked
            advance(loss=f"{loss.item():.3f}", acc1=f"{row['acc1']:.2f}")
            out_of_time = max_seconds is not None and time.monotonic() - t0 >= max_seconds
            if world > 1:  # every rank stops at the same step, or the next all-reduce waits forever
                flag = torch.tensor([float(out_of_time)], device=device)
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
                out_of_time = bool(flag.item())
            save = step % tc.checkpoint_every == 0 or step == end or out_of_time
            if save and held is not None and rank == 0:
                row["heldout_loss"] = round(heldout_loss(objective, held, cfg, device), 5)
                if row["heldout_loss"] < best:
                    best = row["heldout_loss"]
                    if select is None:  # with select_every, best.pt is the best walk's
                        dev.atomic_save({"model": model.state_dict(), "step": step, "heldout_loss": best}, best_path)
            history.append(row)
            if save:
                gens = [gen.get_state()]
                if world > 1:
                    gens = [None] * world
                    torch.distributed.all_gather_object(gens, gen.get_state())
                if rank == 0:
                    dev.atomic_save(
                        {
                            "model": model.state_dict(),
                            "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(),
                            "step": step,
                            "history": history,
                            "best_heldout_loss": best,
                            "head": dict(model.head.raw),
                            "rng": {"data": gens, "torch": torch.get_rng_state(), "python": random.getstate()},
                        },
                        last,
                    )
            if out_of_time:
                break
    if world > 1:
        torch.distributed.barrier()  # rank 0 may still be writing; a rank that leaves early aborts gloo
    tail = history[-50:]
    mean = sum(h["loss"] for h in tail) / max(1, len(tail))
    if rank == 0:
        Manifest.open(run).note(
            "train",
            {
                "method": "eagle3",
                "steps_done": step,
                "steps_planned": tc.steps,
                "records": len(store),
                "final_loss_mean_last50": mean,
                "best_heldout_loss": None if best == float("inf") else best,
                "config": portable_train(tc),
                "device": dev.describe(device),
                "world_size": world,
                "chunk_seconds": round(time.monotonic() - t0, 1),
                "draft_vocab_answer_coverage": coverage(training_records(cfg, run)[0], model.draft_ids.cpu()),
            },
        )
        write_text_atomic(run / "loss-history.json", json.dumps(history) + "\n")
    log(
        f"train: step {step}/{tc.steps}, mean loss of the last {len(tail)} steps {mean:.3f}"
        + ("" if best == float("inf") else f"; best held-out loss {best:.4f}")
    )
    return {"model": model, "step": step, "history": history, "rank": rank, "world": world}


def kept(cfg: TrainConfig, run: Path) -> tuple[Eagle3Drafter, dict[str, Any], str]:
    """The head to measure and export: best.pt (the longest walk with train.select_every, else the
    lowest held-out loss) when there is one, else last.pt."""
    ckpt = run / "checkpoints"
    which = "best.pt" if (ckpt / "best.pt").is_file() else "last.pt"
    if not (ckpt / which).is_file():
        raise TrainConfigError(f"{ckpt / which}: no checkpoint; run the train phase")
    st = dev.load_to_cpu(ckpt / which)
    model, _ = build(cfg, run)
    model.load_state_dict(st["model"])
    if "d2t" in st["model"]:  # the vocabulary it trained with, whatever the records now say
        model.draft_ids = st["model"]["d2t"] + torch.arange(len(st["model"]["d2t"]))
    return model.eval(), st, which


@torch.no_grad()
def offline_acceptance(model: Eagle3Drafter, store: ShardStore, k: int, max_records: int) -> dict[str, Any]:
    """eval.py's measure for a head: at each anchor a (row a - 1), 1 + the leading drafts equal to
    the target's x_{a+1..a+k}; and the walk a server would take over those lengths."""
    lengths, walked = [], []
    device = next(model.parameters()).device  # training selects on the training device
    for i in range(min(max_records, len(store))):
        ids, lm, f = store.get(i)
        anchors = eval_anchors(lm, k)
        anchors = anchors[anchors >= 1]
        if not len(anchors):
            continue
        chains = draft_chains(model, ids[None].to(device), f.float()[None].to(device), k)[0].cpu()
        truth = torch.stack([ids[anchors + 1 + j] for j in range(k)], -1)
        lengths.append(acceptance_lengths(chains[anchors - 1], truth))
        walked.append(walk(anchors, lengths[-1]))
    empty = torch.zeros(0, dtype=torch.long)
    return {
        **summarize(torch.cat(lengths) if lengths else empty, k),
        "walk": summarize(torch.cat(walked) if walked else empty, k),
    }


def evaluate(cfg: TrainConfig, run: Path, log: Log = print) -> dict[str, Any]:
    model, st, which = kept(cfg, run)
    store = ShardStore(run / "capture", "train" if cfg.eval.split == "train" else "heldout")
    if not len(store):
        raise TrainConfigError(f"{run}: no {cfg.eval.split} records captured")
    res: dict[str, Any] = {
        "step": st["step"],
        "checkpoint": which,
        "split": cfg.eval.split,
        "records": min(len(store), cfg.eval.max_records),
        "definition": "teacher-forced against the target's greedy continuation, ttt steps "
        "as a server drafts them; walk: only the anchors a server would draft at",
        "by_k": {},
    }
    for k in cfg.eval.k:
        r = offline_acceptance(model, store, k, cfg.eval.max_records)
        res["by_k"][str(k)] = r
        log(
            f"eval: k={k} offline mean acceptance length {r['mean_acceptance_length']} over {r['drafts']} drafts; "
            f"per position {r['per_position']}; as a server walks {r['walk']['mean_acceptance_length']}"
        )
    write_json_atomic(run / "eval.json", res)
    return res


def export(cfg: TrainConfig, run: Path, log: Log = print) -> Path:
    if not cfg.export.out:
        raise TrainConfigError(f"{cfg.path}: export.out is not set")
    model, st, which = kept(cfg, run)
    config = {k: v for k, v in model.head.raw.items() if k != "torch_dtype"}
    config["draft_vocab_size"] = len(model.draft_ids)
    extras = {"manifest.json": (run / "manifest.json").read_bytes()}
    ev = run / "eval.json"
    if ev.is_file() and read_json_object(ev, error=TrainConfigError).get("step") == st["step"]:
        extras["offline-acceptance.json"] = ev.read_bytes()
    if (run / "loss-history.json").is_file():
        extras["loss-history.json"] = (run / "loss-history.json").read_bytes()
    png = (
        loss_curve_png(read_json(run / "loss-history.json", error=TrainConfigError), run / "loss-curve.png", cfg.name)
        if (run / "loss-history.json").is_file()
        else None
    )
    if png is not None:
        extras["loss-curve.png"] = png.read_bytes()
    has_eval = "offline-acceptance.json" in extras
    extras["README.md"] = drafter_readme(
        cfg,
        json.loads(extras["manifest.json"]),
        st,
        read_json_object(ev, error=TrainConfigError) if has_eval else None,
        EAGLE3,
    ).encode()
    out = export_head(model.state_dict(), config, Path(cfg.export.out), cfg.export.dtype, extras)
    log(f"export: {which} (step {st['step']}) as an EAGLE-3 head")
    return out
