"""The speculators command lines the engine runs, built from our drafter shape and train options.

Pure argv builders (no process is started here; cli.py runs them), so each
mapping from our names to speculators' flags is in one place and testable:

* The drafter is defined by `--draft-config`, a plain Qwen3 decoder config
  written from DrafterShape (draft_config), never by the decoder-shaping flags
  (`--num-layers` and friends): those seed heads and the MLP width from the
  verifier and make every layer sliding-window (2048), which our exported
  config (no `layer_types`) serves as full attention.
* Layer ids: ours are z-lab's (hidden_states[id + 1] of HF's tuple, index 0
  being the embeddings); speculators and vLLM's extract_hidden_states count
  one further (`aux_hidden_state_layer_ids` = ours + 1). The verifier's last
  layer (id num_hidden_layers) is captured implicitly and only feeds the
  target logits, so it is never passed. vLLM's speculators-format loader maps
  back with ids - 1.
* `--mask-token-id`, `--block-size`, `--target-layer-ids` shape a fresh
  drafter only: with `--from-pretrained` speculators takes all three from the
  checkpoint's config.json and silently ignores the flags, so they are left
  out there (export.to_speculators writes the wanted block size into the
  converted config instead).
* The objective: ours is CE on the target's greedy token weighted
  exp(-(k-1)/gamma) from slot 1 (objective.loss_weights); speculators' `ce`
  takes the argmax of the verifier logits and `fixed-exp-decay` is that same
  weight. Its dflash default (`dpace`) is another weighting, so the weighting
  is always named.
* Offline data: `--data-path` is prepare-data's output (arrow + dataset_info),
  `--hidden-states-path` the folder of `hs_<i>.safetensors` the file backend
  reads; `--on-missing raise` so a missing sample is an error, never a
  request to a vLLM endpoint that is not there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ...formats.drafter import DrafterShape
from ...fsio import write_text_atomic

SPECULATOR_TYPE = "dflash"
# Qwen3Config fields written into --draft-config, from the shape.
_DECODER_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "rms_norm_eps",
    "attention_bias",
)


def aux_layer_ids(shape: DrafterShape) -> list[int]:
    """speculators' / vLLM's aux hidden-state ids for our z-lab target_layer_ids (each + 1)."""
    return [i + 1 for i in shape.target_layer_ids]


def target_layer_ids(aux_ids: list[int]) -> list[int]:
    """Our z-lab target_layer_ids for speculators' aux ids (each - 1): the inverse of aux_layer_ids."""
    return [i - 1 for i in aux_ids]


def draft_config(shape: DrafterShape) -> dict[str, Any]:
    """The `--draft-config` JSON: a Qwen3 decoder config with exactly the shape's numbers.

    No sliding window (every layer full attention, as vLLM serves our export),
    untied embeddings (the drafter has none of its own: speculators fills
    them from the verifier), the shape's rope as `rope_parameters` (what
    transformers 5 reads). vocab_size is the target's; speculators overrides
    it with the verifier's anyway and refuses a hidden size unlike the verifier's."""
    cfg: dict[str, Any] = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    cfg.update({k: getattr(shape, k) for k in _DECODER_KEYS})
    cfg.update(
        hidden_act=shape.raw.get("hidden_act", "silu"),
        tie_word_embeddings=False,
        use_sliding_window=False,
        rope_parameters=shape.rope.parameters(),
    )
    if "max_position_embeddings" in shape.raw:
        cfg["max_position_embeddings"] = shape.raw["max_position_embeddings"]
    return cfg


def write_draft_config(shape: DrafterShape, path: Path) -> Path:
    """draft_config(shape) written (atomically) to `path`, for `--draft-config`."""
    return write_text_atomic(path, json.dumps(draft_config(shape), indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class SpecTrainOptions:
    """What one `speculators train` run is told beyond the model: our train options in its terms.

    `max_anchors` counts anchors per packed batch of `total_seq_len` tokens
    (speculators packs sequences into one row), so our batch_size x
    anchors_per_seq and batch_size x max_length give the equivalent batch.
    `epochs` bounds the run with `max_steps`: speculators checks max_steps
    only after a step, so every epoch left once it is reached still runs one
    step and saves one checkpoint; keep epochs at the number the steps need."""

    lr: float = 6e-4
    block_size: int = 8
    max_anchors: int = 512
    gamma: float = 4.0
    max_steps: int | None = None
    epochs: int = 1
    seed: int = 0
    total_seq_len: int = 8192
    weight_decay: float = 0.0
    warmup_steps: int | None = None
    optimizer: str = "adamw"
    scheduler: str = "cosine"
    num_workers: int = 2
    hidden_states_dtype: str = "bfloat16"
    checkpoint_freq: float = 1.0
    fsdp_shard: bool = False
    attn_impl: str = "simple_flex_attention"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def options_from(
    train: Any, seed: int, max_length: int, epochs: int = 1, fsdp_shard: bool = False, **overrides: Any
) -> SpecTrainOptions:
    """SpecTrainOptions from our TrainOptions (train.*), the config's seed and the drafter's max_length."""
    return SpecTrainOptions(
        **{
            "lr": train.lr,
            "block_size": train.block_size,
            "max_anchors": train.batch_size * train.anchors_per_seq,
            "gamma": train.gamma,
            "max_steps": train.steps,
            "epochs": epochs,
            "seed": seed,
            "total_seq_len": train.batch_size * max_length,
            "weight_decay": train.weight_decay,
            "warmup_steps": train.warmup_steps,
            "fsdp_shard": fsdp_shard,
            **overrides,
        }
    )


def train_args(
    shape: DrafterShape,
    target_dir: str | Path,
    data_dir: str | Path,
    hidden_states_dir: str | Path,
    save_path: str | Path,
    opts: SpecTrainOptions,
    *,
    draft_config_path: str | Path | None = None,
    from_pretrained: str | Path | None = None,
    dry_run: bool = False,
    resume: bool = True,
    log_dir: str | Path | None = None,
    trust_remote_code: bool = False,
) -> list[str]:
    """`speculators train` arguments (after `train`, or after torchrun's `-m speculators.train`).

    Exactly one of `draft_config_path` (a fresh drafter of `shape`: write it
    with write_draft_config) and `from_pretrained` (a speculators checkpoint,
    e.g. export.to_speculators of a served drafter, or a dry run's folder) is
    given. `resume=False` passes --no-resume-from-checkpoint; otherwise a
    run whose save_path already holds numbered epoch folders continues from
    the highest. `dry_run` saves the initialised drafter (config.json and
    model.safetensors, bf16) straight into save_path and exits: no data is
    read, so data_dir and hidden_states_dir need not exist."""
    if (draft_config_path is None) == (from_pretrained is None):
        raise ValueError("train_args: give exactly one of draft_config_path and from_pretrained")
    args = ["--speculator-type", SPECULATOR_TYPE, "--verifier-name-or-path", str(target_dir)]
    if trust_remote_code:
        args.append("--trust-remote-code")
    if draft_config_path is not None:
        args += [
            "--draft-config",
            str(draft_config_path),
            "--target-layer-ids",
            *map(str, aux_layer_ids(shape)),
            "--mask-token-id",
            str(shape.mask_token_id),
            "--block-size",
            str(opts.block_size),
        ]
    else:
        args += ["--from-pretrained", str(from_pretrained)]
    args += [
        "--draft-attn-impl",
        opts.attn_impl,
        "--seed",
        str(opts.seed),
        "--data-path",
        str(data_dir),
        "--hidden-states-backend",
        "file",
        "--hidden-states-path",
        str(hidden_states_dir),
        "--on-missing",
        "raise",
        "--total-seq-len",
        str(opts.total_seq_len),
        "--hidden-states-dtype",
        opts.hidden_states_dtype,
        "--num-workers",
        str(opts.num_workers),
        "--max-anchors",
        str(opts.max_anchors),
        "--loss-fn",
        "ce",
        "--per-position-loss-weight",
        "fixed-exp-decay",
        "--dflash-decay-gamma",
        str(opts.gamma),
        "--optimizer",
        opts.optimizer,
        "--lr",
        str(opts.lr),
        "--weight-decay",
        str(opts.weight_decay),
        "--scheduler-type",
        opts.scheduler,
        "--epochs",
        str(opts.epochs),
        "--checkpoint-freq",
        str(opts.checkpoint_freq),
        "--save-path",
        str(save_path),
    ]
    if opts.warmup_steps is not None:
        args += ["--scheduler-warmup-steps", str(opts.warmup_steps)]
    if opts.max_steps is not None:
        args += ["--max-steps", str(opts.max_steps)]
    if opts.fsdp_shard:
        args.append("--fsdp-shard")
    if not resume:
        args.append("--no-resume-from-checkpoint")
    if log_dir is not None:
        args += ["--log-dir", str(log_dir)]
    if dry_run:
        args.append("--dry-run")
    return args


def convert_args(
    drafter_dir: str | Path,
    target_dir: str | Path,
    out_dir: str | Path,
    shape: DrafterShape,
    validate_device: str | None = "cpu",
) -> list[str]:
    """`speculators convert` arguments for one of our (z-lab format) drafters of `shape`.

    The body is copied as-is; embed_tokens / lm_head / verifier norm come from
    the target and are left out of the saved file again (full vocabulary).
    The aux ids are always given (`--algorithm-kwargs`): left to itself the
    converter reads `num_hidden_layers` from the target's top-level config,
    which a multimodal target such as Kimi K2.6 (kimi_k25, the number is under
    text_config) lacks, and it fails with KeyError. `validate_device` reloads
    the result with speculators' own class (a NaN or a missing key fails)."""
    kwargs = json.dumps({"aux_hidden_state_layer_ids": aux_layer_ids(shape)}, separators=(",", ":"))
    args = [
        "convert",
        str(drafter_dir),
        "--algorithm",
        "dflash",
        "--verifier",
        str(target_dir),
        "--output-path",
        str(out_dir),
        "--algorithm-kwargs",
        kwargs,
    ]
    if validate_device:
        args += ["--validate-device", validate_device]
    return args


def prepare_data_args(
    target_dir: str | Path,
    rows: str | Path,
    out_dir: str | Path,
    seq_length: int,
    workers: int = 1,
    trust_remote_code: bool = False,
    seed: int = 0,
) -> list[str]:
    """`speculators prepare-data` arguments for rows.write_rows' JSONL.

    Rows carrying input_ids and loss_mask are passed through unchanged (no
    render endpoint needed, the `id` column is dropped, order is shuffled by
    --seed); the output folder is an arrow dataset (input_ids, loss_mask,
    seq_len). An existing output is kept unless --overwrite."""
    args = [
        "prepare-data",
        "--model",
        str(target_dir),
        "--data",
        str(rows),
        "--output",
        str(out_dir),
        "--seq-length",
        str(seq_length),
        "--num-preprocessing-workers",
        str(workers),
        "--seed",
        str(seed),
    ]
    if trust_remote_code:
        args.append("--trust-remote-code")
    return args
