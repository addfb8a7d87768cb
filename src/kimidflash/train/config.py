"""The training config (JSON): one file says everything a run depends on.

Relative paths resolve from the config file's folder, like the env files.
Unknown keys are refused with the key named, so a typo cannot silently fall
back to a default; a value of the wrong type (in the file or from `--set
train.steps=abc`) is refused with the key and the expected type, so it cannot
travel as a string into the phase that first does arithmetic with it. The
options are typed, frozen sections (target, data, regen, capture, train,
eval, export, cluster, speculators), like the env schema, read by attribute
(`cfg.train.steps`); `as_dict()` is the JSON form the manifest and checkpoints record.
The drafter's shape lives in its own JSON (shape.py) so serving and training
share it.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from ..eagle3 import AUX_IDS, Eagle3Error, Eagle3Head
from ..errors import TrainConfigError
from ..formats.drafter import DrafterShape, read_json_file
from ..paths import cache_dir
from .data import SELFSYNTH

__all__ = [
    "DEFAULTS",
    "PATH_KEYS",
    "TrainConfig",
    "TrainConfigError",
    "TrainOptions",
    "drafter_shape",
    "load",
    "parse_set",
]


# The choices a string option takes: each a Literal, so the type checker follows an edit, and the
# loader refuses any other value naming the key (_type_error reads them by their alias's name).
Engine = Literal["ours", "speculators"]
MethodName = Literal["dflash", "eagle3"]
Device = Literal["auto", "cpu", "cuda"]
Autocast = Literal["auto", "bfloat16", "none"]
ENGINES: tuple[str, ...] = get_args(Engine)
METHODS: tuple[str, ...] = get_args(MethodName)
DEVICES: tuple[str, ...] = get_args(Device)
AUTOCAST: tuple[str, ...] = get_args(Autocast)
_CHOICES = {"Engine": ENGINES, "MethodName": METHODS, "Device": DEVICES, "Autocast": AUTOCAST}


class _Section:
    """A typed section: read by attribute only (so the type checker follows an edit), and its JSON form."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class TargetOptions(_Section):
    serve_config: str | None = None
    serve_overrides: list[str] = field(default_factory=lambda: ["SPECULATIVE_METHOD=none"])
    model_dir: str | None = None


@dataclass(frozen=True)
class DataOptions(_Section):
    prompts: str = "synthetic:1000"
    heldout_fraction: float = 0.05
    min_free_disk_gb: float = 5
    # What the prompts will come to, for `--plan` before the prompts file is on this machine (a
    # Kimi-scale config planned on a laptop): samples, and their mean tokens (prompt and answer).
    planned_samples: int | None = None
    planned_tokens_per_sample: int | None = None


@dataclass(frozen=True)
class RegenOptions(_Section):
    # "server": the served target answers (regen.base_url, or the recipe serves target.serve_config);
    # "hf": a Hugging Face generate() on train.device, concurrency prompts per batch (regen_hf.py)
    source: str = "server"
    base_url: str | None = None
    model: str | None = None
    concurrency: int = 8
    max_tokens: int = 256
    temperature: float = 0.0
    chunk: int = 0
    records: int | None = None


@dataclass(frozen=True)
class CaptureOptions(_Section):
    source: str = "hf"
    mode: str = "cache"  # cache (shards on disk), stream (every batch), memory (once, on the train device)
    dtype: str = "bfloat16"  # how features are stored
    # source=hf: the target's own precision in the forward ("float32", as the reference target
    # is served, or "bfloat16": faster on a CPU with native bf16, features slightly apart;
    # benchmarks/drafter/capture-speed/) and the padded tokens per forward (grouped by length)
    compute_dtype: str = "float32"
    forward_tokens: int = 4096
    shard_records: int = 64  # records per shard (cache) and per capture call (memory)
    # source=vllm: a target already served with SPECULATIVE_METHOD=extract_hidden_states
    # (None: the capture phase serves target.serve_config itself) and how many
    # requests it keeps in flight.
    base_url: str | None = None
    concurrency: int = 8
    # > 0: also store the target's top-k log-probs per position (train.distill)
    topk: int = 0


@dataclass(frozen=True)
class TrainOptions(_Section):
    steps: int = 1000
    batch_size: int = 4
    anchors_per_seq: int = 32
    block_size: int = 8
    gamma: float = 4.0
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    autocast: Autocast = "auto"
    device: Device = "auto"
    checkpoint_every: int = 100
    log_every: int = 10
    threads: int = 0
    records: int | None = None
    init_std: float = 0.02
    vocab_subset: int | None = None
    init_from_target: list[int] | None = None
    init_from_drafter: str | None = None  # an exported drafter to start from (warmstart.py); may grow its layers
    distill: bool = False  # CE against the captured top-k distribution (capture.topk) instead of the greedy token
    # "ours" (this package's trainer: CPU and one device) or "speculators" (vllm-project/speculators under
    # torchrun with FSDP2: Kimi scale; train/speculators/). Both read the same records and export the same drafter.
    engine: Engine = "ours"
    # The drafter family: "dflash" (drafter_config is a DFlash shape) or "eagle3" (drafter_config is an
    # EAGLE-3 head's config.json; our engine only, captured shards: train/eagle3_run.py).
    method: MethodName = "dflash"
    ttt_steps: int = 4  # eagle3: draft steps unrolled in training (training-time test)
    anchor_l2: float = 0.0  # eagle3 fine-tune: L2 pull toward train.init_from_drafter's weights, per step
    # Every N steps rank 0 walks select_records held-out records at eval.k[0] and keeps the best
    # checkpoint as checkpoints/best.pt, which eval and export take (select.py; either family).
    # None: the last (an EAGLE-3 run: the lowest held-out loss).
    select_every: int | None = None
    select_records: int = 256

    @classmethod
    def coerce(cls, tc: TrainOptions | dict[str, Any]) -> TrainOptions:
        """Options as given, or from a dict of some keys (the rest default), type-checked."""
        if isinstance(tc, TrainOptions):
            return tc
        return _build(cls, _merge(asdict(cls()), dict(tc), "train options"), "train options", "train")


@dataclass(frozen=True)
class ClusterOptions(_Section):
    """The machines a run trains on: what `--plan` sizes memory, disk and time against, and what
    the speculators engine's torchrun is given. Defaults describe the machine the command runs on."""

    nodes: int = 1
    gpus_per_node: int = 0  # 0: no accelerator (our trainer on the CPU; speculators only --dry-run)
    gpu_memory_gb: float = 0.0  # per GPU
    gpu_tflops: float = 0.0  # dense bf16 peak per GPU, for the time estimate
    mfu: float = 0.3  # the fraction of that peak training reaches (an assumption the plan states)
    disk_gb: float | None = None  # for captured hidden states; None: what the run folder's disk has free


@dataclass(frozen=True)
class SpeculatorsOptions(_Section):
    """train.engine=speculators: what its commands are given beyond the shared sections."""

    max_length: int = 4096  # prepare-data --seq-length; longer records are cut
    epochs: int = 1
    dry_run: bool = False  # build the drafter and save a checkpoint without training (CPU, CI)
    fsdp_shard: bool = True
    extra_args: list[str] = field(default_factory=list)  # appended to `speculators train` as given


@dataclass(frozen=True)
class EvalOptions(_Section):
    k: list[int] = field(default_factory=lambda: [3, 7])
    max_records: int = 64
    split: str = "heldout"


@dataclass(frozen=True)
class ExportOptions(_Section):
    out: str | None = None
    dtype: str = "bfloat16"
    block_size: int | None = None
    draft_vocab_size: int | None = (
        None  # a head over this many tokens, chosen from the training records (draft_vocab.py)
    )


@dataclass(frozen=True)
class TrainConfig(_Section):
    name: str = "drafter"
    comment: str = ""
    seed: int = 0
    run_dir: str | None = None  # default: <cache>/train-runs/<name>
    target: TargetOptions = field(default_factory=TargetOptions)
    drafter_config: str | None = None
    data: DataOptions = field(default_factory=DataOptions)
    regen: RegenOptions = field(default_factory=RegenOptions)
    capture: CaptureOptions = field(default_factory=CaptureOptions)
    train: TrainOptions = field(default_factory=TrainOptions)
    eval: EvalOptions = field(default_factory=EvalOptions)
    export: ExportOptions = field(default_factory=ExportOptions)
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    speculators: SpeculatorsOptions = field(default_factory=SpeculatorsOptions)
    path: str = ""  # the config file, absolute

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["_path"] = out.pop("path")
        return out

    def shape(self) -> DrafterShape:
        """The drafter shape this config names, loaded and checked."""
        if self.train.method != "dflash":
            raise TrainConfigError(
                f"{self.path}: train.method {self.train.method}: {self.drafter_config} is an "
                "EAGLE-3 head, and this step reads DFlash drafter shapes only"
            )
        return DrafterShape.load(self.drafter_config or "")

    def head(self) -> Eagle3Head:
        """train.method eagle3: the head config.json drafter_config names, with its auxiliary layers stated."""
        raw = read_json_file(Path(self.drafter_config or ""), "drafter_config")
        try:
            head = Eagle3Head.from_config(raw)
        except Eagle3Error as exc:
            raise TrainConfigError(f"{self.drafter_config}: {exc}") from None
        if head.aux_ids is None or min(head.aux_ids) < 1:
            raise TrainConfigError(
                f"{self.drafter_config}: {AUX_IDS} must name the fused layers, each >= 1, to "
                "train a head (capture reads those layers' inputs)"
            )
        return head

    def capture_layer_ids(self) -> list[int]:
        """The target layers capture reads, in its convention (id L: decoder layer L's output): a DFlash
        shape's target_layer_ids, or an EAGLE-3 head's aux ids less one (aux id i is what enters layer i)."""
        if self.train.method == "eagle3":
            return [i - 1 for i in self.head().aux_ids or ()]
        return list(self.shape().target_layer_ids)


DEFAULTS: dict[str, Any] = {k: v for k, v in asdict(TrainConfig()).items() if k != "path"}
PATH_KEYS = (
    ("target", "serve_config"),
    ("target", "model_dir"),
    ("drafter_config",),
    ("run_dir",),
    ("export", "out"),
    ("train", "init_from_drafter"),
)
_SECTION_CLASSES: dict[str, type] = {
    "target": TargetOptions,
    "data": DataOptions,
    "regen": RegenOptions,
    "capture": CaptureOptions,
    "train": TrainOptions,
    "eval": EvalOptions,
    "export": ExportOptions,
    "cluster": ClusterOptions,
    "speculators": SpeculatorsOptions,
}
_TYPES = {
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "str": ((str,), "a string"),
    "bool": ((bool,), "true or false"),
}


def _type_error(ann: str, value: Any) -> str | None:
    """None if `value` fits the annotation (as written in the dataclass), else what was expected."""
    if ann.endswith(" | None"):
        return None if value is None else _type_error(ann[: -len(" | None")], value)
    if ann.startswith("list["):
        inner = ann[5:-1]
        expected = f"a list of {_TYPES[inner][1].split(' ', 1)[1]}s"
        if not isinstance(value, list) or any(_type_error(inner, v) for v in value):
            return expected
        return None
    if ann in _CHOICES:
        return None if value in _CHOICES[ann] else f"one of {', '.join(_CHOICES[ann])}"
    types, expected = _TYPES[ann]
    ok = isinstance(value, types) and (ann == "bool" or not isinstance(value, bool))
    return None if ok else expected


def _check(cls: type, key: str, value: Any, where: str) -> None:
    ann = {f.name: f.type for f in fields(cls)}[key]
    expected = _type_error(str(ann), value)
    if expected:
        raise TrainConfigError(f"{where}: expected {expected}, got {json.dumps(value)}")


def _build(cls: type, values: dict[str, Any], where: str, section: str = "") -> Any:
    """`cls(**values)` once every plain value has its declared type; `where` names the file."""
    for k, v in values.items():
        if k in _SECTION_CLASSES or k == "path":
            continue
        _check(cls, k, v, f"{where}: {section}.{k}" if section else f"{where}: {k}")
    return cls(**values)


def _merge(base: dict, over: dict, where: str) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if k not in base:
            raise TrainConfigError(f"{where}: unknown key '{k}'")
        if isinstance(base[k], dict):
            if not isinstance(v, dict):
                raise TrainConfigError(f"{where}: '{k}' must be an object")
            out[k] = _merge(base[k], v, f"{where}.{k}")
        else:
            out[k] = v
    return out


def _apply_set(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    cls: type
    node, cls = cfg, TrainConfig
    *parents, leaf = dotted.split(".")
    for p in parents:
        if p not in node or not isinstance(node[p], dict):
            raise TrainConfigError(f"--set {dotted}: unknown key '{p}'")
        node, cls = node[p], _SECTION_CLASSES[p]
    if leaf not in node or isinstance(node[leaf], dict):
        raise TrainConfigError(f"--set {dotted}: unknown key '{leaf}'")
    _check(cls, leaf, value, f"--set {dotted}={json.dumps(value) if not isinstance(value, str) else value}")
    node[leaf] = value


def _resolve(value: str | None, folder: Path) -> str | None:
    if value is None:
        return None
    p = Path(os.path.expandvars(os.path.expanduser(value)))
    return str(p if p.is_absolute() else (folder / p).resolve())


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """DEFAULTS, then the file, then `--set` overrides; paths resolved; every value type-checked."""
    path = Path(path)
    raw = read_json_file(path, "training config")
    if not isinstance(raw, dict):
        raise TrainConfigError(f"{path}: expected a JSON object")
    cfg = _merge(DEFAULTS, raw, str(path))
    for dotted, value in (overrides or {}).items():
        _apply_set(cfg, dotted, value)
    folder = path.resolve().parent
    for keys in PATH_KEYS:
        node = cfg
        for k in keys[:-1]:
            node = node[k]
        _check(_SECTION_CLASSES.get(keys[0], TrainConfig), keys[-1], node[keys[-1]], f"{path}: {'.'.join(keys)}")
        node[keys[-1]] = _resolve(node[keys[-1]], folder)
    # a self-synthesised folder is a path, relative to the config as the keys above are
    cfg["data"]["prompts"] = "+".join(
        SELFSYNTH + str(_resolve(part.strip()[len(SELFSYNTH) :], folder))
        if part.strip().startswith(SELFSYNTH)
        else part
        for part in str(cfg["data"]["prompts"]).split("+")
    )
    if not cfg["drafter_config"]:
        raise TrainConfigError(f"{path}: 'drafter_config' is required")
    planned = [cfg["data"]["planned_samples"], cfg["data"]["planned_tokens_per_sample"]]
    if (planned[0] is None) != (planned[1] is None) or any(v is not None and v < 1 for v in planned):
        raise TrainConfigError(
            f"{path}: data.planned_samples and data.planned_tokens_per_sample go together, each at least 1; "
            f"got {planned[0]} and {planned[1]}"
        )
    if cfg["run_dir"] is None:
        _check(TrainConfig, "name", cfg["name"], f"{path}: name")
        cfg["run_dir"] = str(cache_dir() / "train-runs" / cfg["name"])
    sections = {name: _build(cls, cfg[name], str(path), name) for name, cls in _SECTION_CLASSES.items()}
    return _build(TrainConfig, {**cfg, **sections, "path": str(path.resolve())}, str(path))


def drafter_shape(cfg: TrainConfig) -> DrafterShape:
    return cfg.shape()


def parse_set(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise TrainConfigError(f"--set {item}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out
