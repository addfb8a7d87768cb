"""Drafters between our format and speculators': warm starts in, trained checkpoints out.

Our exported drafter (export.py: z-lab DFlash, what vLLM serves) and a
speculators DFlash checkpoint hold the same body under the same names
(`fc`, `hidden_norm`, `layers.N.*`, `norm`) and differ in the rest:

* config.json: speculators nests the Qwen3 decoder under
  `transformer_layer_config` and keeps `aux_hidden_state_layer_ids` (our
  target_layer_ids + 1), `mask_token_id`, `block_size`, `draft_vocab_size`,
  `sample_from_anchor` at the top; ours is DrafterShape.vllm_config.
* tensors: a speculators checkpoint may also carry the target's own weights
  (`embed_tokens`, `verifier_lm_head`, `verifier_norm`, and `lm_head` when it is
  the target's full head), which our format leaves to the target; and, for a
  reduced draft vocabulary, `t2d`/`d2t` and a smaller `lm_head`, which ours
  cannot express (refused).

to_speculators runs `speculators convert` (their code does their format) and
checks that the body came through bit for bit; to_recipe_drafter checks a
speculators checkpoint against our shape, key by key and tensor by tensor, and
writes our drafter folder with export.export_model (whole or not at all).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...checkpoint_layout import LayoutError, require_config, weight_map
from ...errors import SpeculatorsCheckpointError, TrainConfigError
from ...formats.drafter import DrafterShape, Rope
from ...formats.drafter_export import export_model
from ...fsio import atomic_dir, sha256_file, utc_now, write_json_atomic
from ...logtail import Log
from ...paths import portable, portable_argv
from ...safetensors_io import read_header
from ..target_weights import read_tensors
from .cli import run_logged, speculators_argv
from .commands import aux_layer_ids, convert_args, target_layer_ids
from .venv import VERSION

if TYPE_CHECKING:
    import torch

MODEL_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# The target's weights a speculators checkpoint may carry; our format takes them from the target.
TARGET_OWNED = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight")
VOCAB_MAPS = ("t2d", "d2t")
PROVENANCE = "kimidflash-provenance.json"  # written next to a converted (speculators) drafter
DECODER_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "attention_bias",
)


def checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint folder `path` names: itself when it holds config.json and weights (a dry run's
    save_path, a convert output, one epoch folder), else its highest numbered epoch folder (a
    training run's save_path: 0/, 1/, ... as speculators' checkpointer writes them)."""
    p = Path(path)

    def is_ckpt(d: Path) -> bool:
        return (d / "config.json").is_file() and ((d / MODEL_FILE).is_file() or (d / INDEX_FILE).is_file())

    if is_ckpt(p):
        return p
    if p.is_dir():
        epochs = sorted((int(d.name), d) for d in p.iterdir() if d.name.isdigit() and not d.is_symlink() and is_ckpt(d))
        if epochs:
            return epochs[-1][1]
    raise SpeculatorsCheckpointError(
        f"{path}: no speculators checkpoint (config.json and {MODEL_FILE}, or numbered epoch folders holding them)"
    )


def tensor_files(ckpt: Path) -> dict[str, str]:
    """Every tensor name of a checkpoint folder and the file holding it (checkpoint_layout's reader:
    an index of shards, else the files' headers)."""
    try:
        return weight_map(ckpt)
    except LayoutError as exc:
        raise SpeculatorsCheckpointError(str(exc)) from None


def _load(ckpt: Path, files: dict[str, str], names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors as stored (dtype kept)."""
    return read_tensors(ckpt, files, names, float32=False)


def _tensor_shapes(ckpt: Path, files: dict[str, str]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, from the safetensors headers alone."""
    out: dict[str, tuple[int, ...]] = {}
    for f in set(files.values()):
        out.update((n, tuple(h["shape"])) for n, h in read_header(ckpt / f).items() if n != "__metadata__")
    return out


def check_config(cfg: dict[str, Any], shape: DrafterShape, where: str) -> None:
    """Refuse a speculators config.json that does not describe a DFlash drafter of `shape`, naming the key.

    block_size is not compared: it is how many slots a step was trained on,
    and our export serves the shape's (export.block_size may differ, as it
    does for the shipped SmolLM2 drafter)."""

    def bad(key: str, got: Any, want: Any) -> SpeculatorsCheckpointError:
        return SpeculatorsCheckpointError(
            f"{where}: config.json {key} is {got!r}, the drafter shape {shape.source} needs {want!r}"
        )

    kind = cfg.get("speculators_model_type")
    if kind != "dflash":
        raise bad("speculators_model_type", kind, "dflash")
    tlc = cfg.get("transformer_layer_config")
    if not isinstance(tlc, dict):
        raise SpeculatorsCheckpointError(f"{where}: config.json has no transformer_layer_config")
    if tlc.get("model_type", "qwen3") != "qwen3":
        raise bad("transformer_layer_config.model_type", tlc.get("model_type"), "qwen3")
    for key in DECODER_KEYS:
        if tlc.get(key) != getattr(shape, key):
            raise bad(f"transformer_layer_config.{key}", tlc.get(key), getattr(shape, key))
    head_dim = tlc.get("head_dim") or tlc["hidden_size"] // tlc["num_attention_heads"]
    if head_dim != shape.head_dim:
        raise bad("transformer_layer_config.head_dim", head_dim, shape.head_dim)
    eps = tlc.get("rms_norm_eps")
    if not isinstance(eps, (int, float)) or not math.isclose(eps, shape.rms_norm_eps, rel_tol=1e-6):
        raise bad("transformer_layer_config.rms_norm_eps", eps, shape.rms_norm_eps)
    act = shape.raw.get("hidden_act", "silu")
    if tlc.get("hidden_act", "silu") != act:
        raise bad("transformer_layer_config.hidden_act", tlc.get("hidden_act"), act)
    sliding = [i for i, t in enumerate(tlc.get("layer_types") or []) if t != "full_attention"]
    if sliding or tlc.get("use_sliding_window"):
        raise SpeculatorsCheckpointError(
            f"{where}: draft layers {sliding or 'all'} were trained with sliding-window attention "
            f"(window {tlc.get('sliding_window')}); our export is served with full attention. Train with "
            "--draft-config (commands.draft_config), not the decoder-shaping flags"
        )
    rope = Rope.from_raw(tlc, f"{where}: transformer_layer_config")
    if rope != shape.rope:
        raise bad("transformer_layer_config rope", rope.parameters(), shape.rope.parameters())
    aux = cfg.get("aux_hidden_state_layer_ids")
    if aux != aux_layer_ids(shape):
        raise bad(
            "aux_hidden_state_layer_ids",
            aux,
            f"{aux_layer_ids(shape)} (target_layer_ids {list(shape.target_layer_ids)} + 1)",
        )
    if cfg.get("mask_token_id") != shape.mask_token_id:
        raise bad("mask_token_id", cfg.get("mask_token_id"), shape.mask_token_id)
    if cfg.get("sample_from_anchor"):
        raise bad("sample_from_anchor", True, False)
    if cfg.get("draft_vocab_size", shape.vocab_size) != shape.vocab_size:
        raise SpeculatorsCheckpointError(
            f"{where}: draft_vocab_size {cfg.get('draft_vocab_size')} is a reduced draft vocabulary; our "
            f"format serves the target's full {shape.vocab_size} (train without --draft-vocab-size)"
        )
    if cfg.get("target_hidden_size") not in (None, shape.hidden_size):
        raise bad("target_hidden_size", cfg.get("target_hidden_size"), shape.hidden_size)


def body_names(ckpt: Path, files: dict[str, str], shape: DrafterShape, where: str) -> tuple[list[str], list[str]]:
    """(our tensor names, the target-owned names to leave out), after checking every name and shape."""
    want = shape.expected_tensors()
    got = _tensor_shapes(ckpt, files)
    for name in VOCAB_MAPS:
        if name in got:
            raise SpeculatorsCheckpointError(
                f"{where}: tensor {name} maps a reduced draft vocabulary, which our format cannot serve "
                "(train without --draft-vocab-size)"
            )
    dropped = []
    for name in TARGET_OWNED + ("lm_head.weight",):
        if name not in got:
            continue
        if name == "lm_head.weight" and got[name] != (shape.vocab_size, shape.hidden_size):
            raise SpeculatorsCheckpointError(
                f"{where}: tensor lm_head.weight has shape {list(got[name])}, a draft vocabulary of "
                f"{got[name][0]}; our format serves the target's head ({shape.vocab_size} x {shape.hidden_size})"
            )
        dropped.append(name)
    for name, s in sorted(got.items()):
        if name in dropped:
            continue
        if name not in want:
            raise SpeculatorsCheckpointError(
                f"{where}: tensor {name} {list(s)} is not part of a DFlash drafter of {shape.source}"
            )
        if s != want[name]:
            raise SpeculatorsCheckpointError(
                f"{where}: tensor {name} has shape {list(s)}, the drafter shape {shape.source} needs {list(want[name])}"
            )
    missing = sorted(set(want) - set(got))
    if missing:
        raise SpeculatorsCheckpointError(
            f"{where}: tensor {missing[0]} is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    return list(want), dropped


def read_checkpoint(
    spec_ckpt_dir: str | Path, shape: DrafterShape
) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor], list[str], list[Path]]:
    """(checkpoint folder, its config.json, our tensors by name, target-owned names left out, its
    tensor files), all checked."""
    import torch

    ckpt = checkpoint_dir(spec_ckpt_dir)
    where = str(ckpt)
    cfg = require_config(ckpt, "speculators checkpoint", SpeculatorsCheckpointError)
    check_config(cfg, shape, where)
    files = tensor_files(ckpt)
    names, dropped = body_names(ckpt, files, shape, where)
    state = _load(ckpt, files, names)
    for name, t in state.items():
        if not torch.isfinite(t).all():
            raise SpeculatorsCheckpointError(f"{where}: tensor {name} holds NaN or infinite values")
    return ckpt, cfg, state, dropped, sorted({ckpt / f for f in files.values()})


def _artifact(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def _portable_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json as recorded: the verifier path made portable (committed manifests name no machine's layout)."""
    out = json.loads(json.dumps(cfg))
    verifier = (out.get("speculators_config") or {}).get("verifier") or {}
    if isinstance(verifier.get("name_or_path"), str):
        verifier["name_or_path"] = portable(verifier["name_or_path"])
    return out


def _train_command(ckpt: Path) -> list[str] | None:
    """The command speculators recorded (train_command.txt: comment lines, then the command), portable."""
    for d in (ckpt, ckpt.parent):
        text = _artifact(d / "train_command.txt")
        if text is not None:
            lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
            return [portable_argv(ln) for ln in lines]
    return None


def to_recipe_drafter(
    spec_ckpt_dir: str | Path,
    shape: DrafterShape,
    out_dir: str | Path,
    dtype: str = "bfloat16",
    provenance: dict[str, Any] | None = None,
) -> Path:
    """A speculators DFlash checkpoint as our drafter folder (what serve.sh's DRAFT_MODEL_DIR loads).

    `spec_ckpt_dir` is a checkpoint folder or a training save_path (its
    highest epoch is taken). config.json is shape.vllm_config(dtype), so the
    shape decides the served block size (pass shape.with_block_size(n) for
    another); model.safetensors holds exactly shape.expected_tensors(), cast
    to `dtype`. manifest.json is `provenance` (the caller's record of the run)
    with `speculators_export` added: the source checkpoint and its file
    checksums, its config.json and train command, the layer-id and
    block-size mapping and the tensors left out. Written whole or not at all."""
    ckpt, cfg, state, dropped, files = read_checkpoint(spec_ckpt_dir, shape)
    record = {
        "exported_at": utc_now(),
        "checkpoint": portable(ckpt.resolve()),
        "files": {f.name: sha256_file(f) for f in files},
        "speculators_version": cfg.get("speculators_version"),
        "transformers_version": cfg.get("transformers_version"),
        "aux_hidden_state_layer_ids": cfg.get("aux_hidden_state_layer_ids"),
        "target_layer_ids": target_layer_ids(cfg["aux_hidden_state_layer_ids"]),
        "trained_block_size": cfg.get("block_size"),
        "served_block_size": shape.block_size,
        "left_out": dropped,
        "drafter_shape": portable(shape.source) if os.path.isabs(shape.source) else shape.source,
        "train_command": _train_command(ckpt),
        "config": _portable_config(cfg),
    }
    manifest = {**(provenance or {}), "speculators_export": record}
    extras = {"manifest.json": (json.dumps(manifest, indent=2) + "\n").encode()}
    return export_model(state, shape, Path(out_dir), dtype, extras)


def _staged(drafter_dir: Path, block_size: int, into: Path) -> Path:
    """`drafter_dir` with config.json's block_size replaced (weights linked, not copied)."""
    into.mkdir(parents=True, exist_ok=True)
    cfg = require_config(drafter_dir, "drafter", TrainConfigError)
    cfg["block_size"] = block_size
    (into / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for p in drafter_dir.iterdir():
        if p.name.endswith(".safetensors") or p.name == INDEX_FILE:
            os.symlink(p.resolve(), into / p.name)
    return into


def to_speculators(
    drafter_dir: str | Path,
    target_dir: str | Path,
    out_dir: str | Path,
    log_path: str | Path,
    block_size: int | None = None,
    validate_device: str | None = "cpu",
    echo: Log = print,
) -> Path:
    """One of our exported drafters as a speculators checkpoint, for `--from-pretrained` (a warm start).

    Runs `speculators convert` (output in `log_path`) into a fresh folder that
    replaces `out_dir` only when it is complete and checked: its config must
    describe the drafter's own shape and every body tensor must equal the
    source's exactly. speculators takes block_size, mask token and layer ids
    from this config when training from it (the CLI flags are ignored then),
    so `block_size` (the block the run will train on) is written here; None
    keeps the drafter's served one. Records `kimidflash-provenance.json`."""
    import torch

    src = Path(drafter_dir).resolve()
    shape = DrafterShape.from_dict(require_config(src, "drafter", TrainConfigError), str(src / "config.json"))
    if block_size is not None:
        shape = shape.with_block_size(block_size)
    out = Path(out_dir).resolve()
    with atomic_dir(out) as tmp:
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".src", dir=out.parent))
        try:
            given = src if block_size is None else _staged(src, block_size, stage / "drafter")
            run_logged(
                speculators_argv(*convert_args(given, target_dir, tmp, shape, validate_device)),
                Path(log_path),
                "speculators convert",
                echo=echo,
            )
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        cfg = require_config(tmp, "speculators convert output", SpeculatorsCheckpointError)
        check_config(cfg, shape, f"{out} (speculators convert of {src})")
        if cfg.get("block_size") != shape.block_size:
            raise SpeculatorsCheckpointError(
                f"{out}: converted block_size {cfg.get('block_size')}, wanted {shape.block_size}"
            )
        files = tensor_files(tmp)
        names, _ = body_names(tmp, files, shape, f"{out} (speculators convert of {src})")
        ours = tensor_files(src)
        for name in names:  # one pair in memory at a time (a K2.6 drafter body is gigabytes)
            t, u = _load(src, ours, [name])[name], _load(tmp, files, [name])[name]
            if t.dtype != u.dtype or not torch.equal(t, u):
                raise SpeculatorsCheckpointError(f"{out}: tensor {name} differs from {src}'s after speculators convert")
        write_json_atomic(
            tmp / PROVENANCE,
            {
                "converted_at": utc_now(),
                "source": portable(src),
                "source_files": {f: sha256_file(src / f) for f in sorted(set(ours.values()))},
                "target": portable(Path(target_dir).resolve()),
                "speculators": VERSION,
                "block_size": shape.block_size,
                "command": portable_argv(speculators_argv(*convert_args(src, target_dir, out, shape, validate_device))),
            },
        )
    return out
