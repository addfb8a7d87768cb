"""capture: the target's hidden states at `target_layer_ids`, behind one interface.

Two sources answer `CaptureSource.features(input_ids) -> [T, n_layers * H]`:

* `HFCapture` runs a Hugging Face forward pass (small targets, CPU). Layer id
  L is `hidden_states[L + 1]` (the output of decoder layer L), which is what
  vLLM hands the drafter when serving (it adds 1 to each id and captures the
  stream after that many layers).
* `VLLMCapture` (capture_vllm.py) asks the served target: vLLM's
  `extract_hidden_states` writes the same features, one file per request. The
  capture phase serves `target.serve_config` for it, or uses `capture.base_url`.

Two modes: `cache` writes shards (safetensors, resumable shard by shard) for
targets small enough that re-running the forward pass each epoch would cost
more than the disk (SmolLM2: 5 x 576 x 2 B = 5.8 KB per token); `stream`
computes the features inside the training step and stores nothing (Kimi:
6 x 7168 x 2 B = 86 KB per token; a billion tokens would be 86 TB).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

import torch

from ..background import served
from ..errors import TrainConfigError
from ..formats.drafter import check_layer_ids
from ..fsio import read_json_object, write_bytes_atomic, write_text_atomic
from ..logtail import Log
from . import device
from .capture_vllm import VLLMCapture, states_dir
from .config import TrainConfig
from .data import Record, read_records, split, usable
from .distill import Captured, topk_table
from .manifest import Manifest
from .progress import bar
from .target import capture_overrides, remote_code, target_info

if TYPE_CHECKING:
    from safetensors import safe_open

MODES = ("cache", "stream", "memory")
COMPUTE_DTYPES = ("float32", "bfloat16")

CPU = torch.device("cpu")


def check_mode(cfg: TrainConfig) -> str:
    """capture.mode, refused by name when it is none of MODES."""
    if cfg.capture.mode not in MODES:
        raise TrainConfigError(f"{cfg.path}: capture.mode {cfg.capture.mode!r}: expected one of {', '.join(MODES)}")
    return cfg.capture.mode


class CaptureSource(Protocol):
    layer_ids: list[int]

    def capture(self, input_ids: Sequence[int]) -> Captured:
        """The target's hidden states (and top-k table) for one sequence."""

    def capture_many(self, seqs: Sequence[Sequence[int]]) -> list[Captured]:
        """capture() for several sequences at once (one batched forward, or requests in flight)."""

    def features(self, input_ids: Sequence[int]) -> torch.Tensor:
        """[T, len(layer_ids) * H] hidden states of the target for one sequence."""


class SequenceStore(Protocol):
    """Where training and evaluation read sequences from: ShardStore, StreamStore or MemoryStore."""

    def __len__(self) -> int: ...

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids [T] long, loss_mask [T] long, feats [T, nH]) of sequence i."""


def length_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices sorted by length, cut so that each group's count x longest stays within
    `budget` padded tokens (a longer sequence alone makes its own group)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[i] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class HFCapture:
    def __init__(
        self,
        model_dir: str | Path,
        layer_ids: list[int],
        dtype: torch.dtype = torch.bfloat16,
        compute_dtype: torch.dtype = torch.float32,
        device: torch.device = CPU,
        topk: int = 0,
        forward_tokens: int = 4096,
        trust_remote_code: bool = False,
    ):
        from transformers import AutoModelForCausalLM

        self.model = (
            AutoModelForCausalLM.from_pretrained(model_dir, dtype=compute_dtype, trust_remote_code=trust_remote_code)
            .eval()
            .to(device)
        )
        self.device = device
        # the text model's layer count (a multimodal wrapper nests it under text_config)
        check_layer_ids(layer_ids, self.model.config.get_text_config().num_hidden_layers, str(model_dir))
        self.layer_ids, self.dtype, self.topk = list(layer_ids), dtype, topk
        self.forward_tokens = forward_tokens

    def capture(self, input_ids: Sequence[int]) -> Captured:
        return self.capture_many([input_ids])[0]

    def capture_many(self, seqs: Sequence[Sequence[int]], on_device: bool = False) -> list[Captured]:
        """The sequences sorted by length and cut into forwards of at most `forward_tokens`
        padded tokens (one sequence at least), so little is spent on padding; results in the
        given order. `on_device`: the features stay where they were computed (memory mode),
        else on the CPU. Measured on 2 CPU cores: benchmarks/drafter/capture-speed/."""
        out: list[Captured | None] = [None] * len(seqs)
        for group in length_groups([len(s) for s in seqs], self.forward_tokens):
            for i, c in zip(group, self._forward([seqs[i] for i in group], on_device), strict=False):
                out[i] = c
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _forward(self, seqs: Sequence[Sequence[int]], on_device: bool) -> list[Captured]:
        """One forward over the sequences, right-padded (causal attention: a token never sees
        the padding after it). On a GPU the matmuls may use TF32: the features are stored in
        bfloat16, whose rounding is coarser, and a batch costs about a fifth of full float32."""
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        att = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(list(s))
            att[i, : len(s)] = 1
        with device.float32_matmul("high" if self.device.type == "cuda" else "highest"):
            out = self.model.model(
                input_ids=ids.to(self.device), attention_mask=att.to(self.device), output_hidden_states=True
            )
            hs = out.hidden_states
            feats = torch.cat([hs[i + 1] for i in self.layer_ids], dim=-1).to(self.dtype)
            feats = feats if on_device else feats.cpu()
            logits = self.model.lm_head(out.last_hidden_state).cpu() if self.topk else None
        return [
            Captured(feats[i, : len(s)].clone(), None if logits is None else topk_table(logits[i, : len(s)], self.topk))
            for i, s in enumerate(seqs)
        ]

    def features(self, input_ids: Sequence[int]) -> torch.Tensor:
        return self.capture(input_ids).feats


def make_source(
    cfg: TrainConfig, model_dir: str | Path, layer_ids: Sequence[int], base_url: str | None = None
) -> CaptureSource:
    src = cfg.capture.source
    dtype = getattr(torch, cfg.capture.dtype)
    if src == "hf":
        if cfg.capture.compute_dtype not in COMPUTE_DTYPES:
            raise TrainConfigError(
                f"{cfg.path}: capture.compute_dtype {cfg.capture.compute_dtype!r}: expected "
                f"one of {', '.join(COMPUTE_DTYPES)}"
            )
        if cfg.capture.forward_tokens < 1:
            raise TrainConfigError(f"{cfg.path}: capture.forward_tokens {cfg.capture.forward_tokens}: expected >= 1")
        return HFCapture(
            model_dir,
            list(layer_ids),
            dtype,
            compute_dtype=getattr(torch, cfg.capture.compute_dtype),
            device=device.resolve(cfg.train.device),
            topk=cfg.capture.topk,
            forward_tokens=cfg.capture.forward_tokens,
            trust_remote_code=remote_code(cfg, str(model_dir)),
        )
    if src == "vllm":
        base_url = base_url or cfg.capture.base_url
        if not base_url:
            raise TrainConfigError(
                f"{cfg.path}: capture.source=vllm with mode={cfg.capture.mode} needs "
                "capture.base_url, a target served with SPECULATIVE_METHOD="
                "extract_hidden_states (the capture phase in cache mode serves one itself)"
            )
        return VLLMCapture(
            base_url,
            target_info(cfg).served_name,
            list(layer_ids),
            dtype,
            cfg.capture.concurrency,
            topk=cfg.capture.topk,
        )
    raise ValueError(f"capture.source '{src}': expected hf or vllm")


@contextlib.contextmanager
def opened_source(cfg: TrainConfig, run: Path, layer_ids: Sequence[int]) -> Iterator[CaptureSource]:
    """The capture source for the capture phase; for source=vllm without base_url,
    the recipe's target served with extract_hidden_states for as long as it runs."""
    info = target_info(cfg)
    if cfg.capture.source != "vllm" or cfg.capture.base_url:
        yield make_source(cfg, info.model_dir, layer_ids)
        return
    if not cfg.target.serve_config:
        raise TrainConfigError(f"{cfg.path}: capture.source=vllm needs target.serve_config or capture.base_url")
    overrides = capture_overrides(cfg, list(layer_ids), states_dir(run))
    with served(cfg.target.serve_config, overrides, run / "capture-server.log") as base:
        yield make_source(cfg, info.model_dir, layer_ids, base_url=base)


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


def source_label(cfg: TrainConfig) -> str:
    """What computed a shard's features, kept in its metadata: a shard from another
    source or precision is captured again instead of being mixed in."""
    return f"hf {cfg.capture.compute_dtype}" if cfg.capture.source == "hf" else cfg.capture.source


class _ShardEntry(TypedDict):
    """One shard in capture/index.json: its file, whose records (train or heldout) and their ids."""

    file: str
    kind: str
    ids: list[str]


class _CaptureIndex(TypedDict):
    """capture/index.json, as capture_shards writes it and ShardStore reads it."""

    layer_ids: list[int]
    topk: int
    source: str
    shards: list[_ShardEntry]


def _topk(c: Captured) -> tuple[torch.Tensor, torch.Tensor]:
    """A capture's top-k table, there when the first capture of its batch has one."""
    assert c.topk is not None, "a capture source takes top-k tables for every sequence or for none"
    return c.topk


def write_shard(path: Path, recs: Sequence[Record], source: CaptureSource, label: str) -> None:
    from safetensors.torch import save

    caps = source.capture_many([r.input_ids for r in recs])
    offsets = torch.tensor([0] + [len(r.input_ids) for r in recs]).cumsum(0)
    tensors = {
        "feats": torch.cat([c.feats for c in caps]).contiguous(),
        "offsets": offsets,
        "input_ids": torch.tensor([t for r in recs for t in r.input_ids], dtype=torch.int32),
        "loss_mask": torch.tensor([m for r in recs for m in r.loss_mask], dtype=torch.int8),
    }
    if caps and caps[0].topk is not None:
        tables = [_topk(c) for c in caps]
        tensors["topk_ids"] = torch.cat([t[0] for t in tables]).contiguous()
        tensors["topk_logp"] = torch.cat([t[1] for t in tables]).contiguous()
    write_bytes_atomic(path, save(tensors, metadata={"ids": json.dumps([r.id for r in recs]), "source": label}))


def capture_shards(cfg: TrainConfig, run: Path, log: Log = print) -> int:
    """Write the shards that are missing (train and held-out records); return the shard count."""
    train, held = training_records(cfg, run)
    folder = run / "capture"
    folder.mkdir(parents=True, exist_ok=True)
    per = cfg.capture.shard_records
    groups = [train[i : i + per] for i in range(0, len(train), per)] + [
        held[i : i + per] for i in range(0, len(held), per)
    ]
    label = source_label(cfg)
    index: _CaptureIndex = {
        "layer_ids": cfg.capture_layer_ids(),
        "topk": cfg.capture.topk,
        "source": label,
        "shards": [],
    }
    todo = []
    for i, g in enumerate(groups):
        kind = "train" if i < (len(train) + per - 1) // per else "heldout"
        index["shards"].append({"file": _shard_path(folder, i).name, "kind": kind, "ids": [r.id for r in g]})
        if not _shard_path(folder, i).is_file() or _stale(_shard_path(folder, i), g, cfg.capture.topk, label):
            todo.append((i, g))
    done = {"shards": 0, "records": 0, "tokens": 0, "seconds": 0.0}
    if todo:
        torch.set_num_threads(max(1, cfg.train.threads or torch.get_num_threads()))
        with (
            opened_source(cfg, run, index["layer_ids"]) as source,
            bar("capture", len(groups), start=len(groups) - len(todo)) as advance,
        ):
            start = time.monotonic()
            for i, g in todo:
                write_shard(_shard_path(folder, i), g, source, label)
                done["shards"] += 1
                done["records"] += len(g)
                done["tokens"] += sum(len(r.input_ids) for r in g)
                done["seconds"] = round(time.monotonic() - start, 1)
                advance()
    write_text_atomic(folder / "index.json", json.dumps(index) + "\n")
    Manifest.open(run).note_regen(run / "regen.jsonl", cfg.regen.as_dict())
    # this invocation's work and time (model loading excluded): the capture rate of the machine
    note_capture(
        cfg,
        run,
        train,
        held,
        shards=len(groups),
        computed=label,
        forward_tokens=cfg.capture.forward_tokens,
        this_invocation=done,
        device=device.describe(device.resolve(cfg.train.device)),
    )
    return len(groups)


def note_capture(cfg: TrainConfig, run: Path, train: Sequence[Record], held: Sequence[Record], **extra: object) -> None:
    """The data the drafter learns from, in the manifest (the export README quotes it), in every mode."""
    Manifest.open(run).note(
        "capture",
        {
            "source": cfg.capture.source,
            "mode": cfg.capture.mode,
            **extra,
            "train_records": len(train),
            "heldout_records": len(held),
            "train_tokens": sum(len(r.input_ids) for r in train),
            "train_response_tokens": sum(r.n_response for r in train),
            "heldout_ids": [r.id for r in held],
        },
    )


def _stale(path: Path, recs: Sequence[Record], topk: int, label: str) -> bool:
    """Other records, not the top-k the config asks for (a shard with more is kept), or
    features from another source or precision (shards from before labels were written,
    all float32, are kept)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        have = f.get_slice("topk_ids").get_shape()[1] if "topk_ids" in f.keys() else 0  # noqa: SIM118 - safe_open has keys() but is no container
        meta = f.metadata()
        return json.loads(meta["ids"]) != [r.id for r in recs] or have < topk or meta.get("source", label) != label


class ShardStore:
    """Random access to captured sequences (memory-mapped), for train or held-out records."""

    def __init__(self, folder: Path, kind: str):
        from safetensors import safe_open

        index = read_json_object(folder / "index.json", "capture index", TrainConfigError)
        self.items: list[tuple[int, int]] = []
        self._files: list[safe_open] = []
        self._offsets: list[torch.Tensor] = []
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

    def _span(self, i: int) -> tuple[safe_open, int, int]:
        fi, j = self.items[i]
        off = self._offsets[fi]
        return self._files[fi], int(off[j]), int(off[j + 1])

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids [T] long, loss_mask [T] long, feats [T, nH])."""
        f, a, b = self._span(i)
        return (f.get_slice("input_ids")[a:b].long(), f.get_slice("loss_mask")[a:b].long(), f.get_slice("feats")[a:b])

    @property
    def has_topk(self) -> bool:
        return bool(self._files) and all("topk_ids" in f.keys() for f in self._files)  # noqa: SIM118 - safe_open: keys() only

    def topk(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's top-k table of sequence i (distill.py): ids [T, k], log-probs [T, k]."""
        f, a, b = self._span(i)
        return f.get_slice("topk_ids")[a:b], f.get_slice("topk_logp")[a:b]


class StreamStore:
    """The same interface as ShardStore, computing features on demand (stream mode)."""

    def __init__(self, records: Sequence[Record], source: CaptureSource):
        self.records, self.source = list(records), source

    def __len__(self) -> int:
        return len(self.records)

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.get_many([i])[0]

    def get_many(self, idx: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """get() for several sequences, their features from one capture_many() call."""
        recs = [self.records[i] for i in idx]
        caps = self.source.capture_many([r.input_ids for r in recs])
        return [
            (torch.tensor(r.input_ids), torch.tensor(r.loss_mask), c.feats) for r, c in zip(recs, caps, strict=False)
        ]


def free_bytes(device: torch.device) -> int:
    """Memory free on `device`: the GPU's, or the machine's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class MemoryStore:
    """Every training sequence's features captured once, kept on the train device (memory mode).

    For a GPU with room for them (SmolLM2: 5.8 KB per token, docs/drafter-training.md): stream mode
    recomputes a batch's features every step and copies them through the CPU (7.6 steps/s at batch
    32 on an H100, benchmarks/drafter/gpu-h100-1/). Refused up front, naming the
    sizes, when the features would not fit in 90% of the device's free memory."""

    def __init__(self, records: Sequence[Record], source: HFCapture, batch: int, log: Log = print):
        width = len(source.layer_ids) * source.model.config.hidden_size
        tokens = sum(len(r.input_ids) for r in records)
        need = tokens * width * torch.empty((), dtype=source.dtype).element_size()
        free = free_bytes(source.device)
        if need > 0.9 * free:
            raise TrainConfigError(
                f"capture.mode=memory: {len(records)} records' features need "
                f"{need / 2**30:.1f} GiB, {source.device} has {free / 2**30:.1f} GiB free; "
                "use capture.mode=cache or stream, or fewer train.records"
            )
        self.records = list(records)
        self.offsets = [0]
        for r in self.records:
            self.offsets.append(self.offsets[-1] + len(r.input_ids))
        self.feats = torch.empty((tokens, width), dtype=source.dtype, device=source.device)
        log(f"capture: {len(records)} records ({tokens} tokens, {need / 2**30:.1f} GiB) into {source.device} memory")
        with bar("capture", len(self.records)) as advance:
            for i in range(0, len(self.records), batch):
                group = self.records[i : i + batch]
                for j, c in enumerate(source.capture_many([r.input_ids for r in group], on_device=True)):
                    self.feats[self.offsets[i + j] : self.offsets[i + j + 1]] = c.feats
                advance(len(group))

    def __len__(self) -> int:
        return len(self.records)

    def get(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r = self.records[i]
        return torch.tensor(r.input_ids), torch.tensor(r.loss_mask), self.feats[self.offsets[i] : self.offsets[i + 1]]
