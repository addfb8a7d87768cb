"""``kimidflash calibrate``: measure per-layer KV-cache maxima and write FP8 scales.

Runs a calibration prompt set (default: the shipped ``payload/kv_calibration_prompts.jsonl``,
200 prompts of code, math, chat and long context) through the model with transformers,
one prompt at a time (no padding, so no pad token ever reaches the maxima), records
what the KV cache stores per layer (``capture``), and writes a ``KvScales`` JSON: amax
values, checkpoint scales (OCP e4m3fn units, what vLLM loads; doubled by vLLM on
e4m3fnuz), provenance and a summary. ``--overlay DIR`` also writes the checkpoint
overlay a stock vLLM serves with the scales loaded (``checkpoint.write_overlay``).

Every input is checked before the model is loaded, and outputs are written
atomically at the end, so bad input costs seconds and a failure leaves nothing half
written. Errors are one line naming the culprit, exit status 2.
"""

from __future__ import annotations

import json
import platform
import random
import resource
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..checkpoint_layout import is_mla, text_config
from ..errors import CalibrationError, CheckpointError, KvCaptureError
from ..formats.fp8 import DEFAULT_HEADROOM
from ..formats.kv_scales import Attention, KvScales, LayerScale
from ..fsio import sha256_file, utc_now
from ..paths import REPO_ROOT, portable
from .capture import KvCapture
from .checkpoint import check_overlay_target, load_config, num_layers

DEFAULT_PROMPTS = REPO_ROOT / "payload" / "kv_calibration_prompts.jsonl"
# model_type -> attention kind; the families whose attention code capture.py instruments.
SUPPORTED: dict[str, Attention] = {
    "deepseek_v3": "mla",
    "deepseek_v2": "mla",
    "kimi_k2": "mla",
    "llama": "mha",
    "qwen3": "mha",
    "qwen2": "mha",
    "mistral": "mha",
}
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_TOKENS_RANGE = (16, 262144)


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


def load_prompts(path: Path) -> list[Prompt]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read the prompt set: {exc.strerror or exc}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(Prompt(str(d["id"]), str(d["category"]), str(d["prompt"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CalibrationError(f"{path}:{n}: not a prompt record (id, category, prompt): {exc!r}") from None
    if not out:
        raise CalibrationError(f"{path}: no prompts")
    return out


def select(prompts: list[Prompt], n: int, seed: int) -> list[Prompt]:
    """``n`` prompts chosen by ``seed``: the same seed gives the same prompts in the same order."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    return [prompts[i] for i in order[:n]]


def encode(tok: Any, text: str, max_tokens: int) -> list[int]:
    """Token ids as the server would see the prompt: the chat template when the
    tokenizer has one (generation prompt added), else the plain text; cut to max_tokens."""
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
    else:
        ids = tok(text)["input_ids"]
    return list(ids)[:max_tokens]


# ------------------------------------------------------------------ checks
@dataclass(frozen=True)
class CalibrateOptions:
    """What one `kimidflash calibrate` run is asked to do (the defaults are the command line's)."""

    model_dir: Path
    output: Path = Path("kv-scales.json")
    prompts: Path = DEFAULT_PROMPTS
    num_prompts: int = 200
    max_tokens: int = 4096
    seed: int = 0
    dtype: str = "auto"  # one of DTYPES
    device: str = "cpu"
    headroom: float = DEFAULT_HEADROOM
    trust_remote_code: bool = False
    overlay: Path | None = None
    force: bool = False
    kv_format: str = "e4m3fnuz"


def check_inputs(opts: CalibrateOptions) -> tuple[dict[str, Any], Attention, list[Prompt]]:
    """Everything that can be wrong before loading a model: (config, attention, prompts)."""
    model_dir: Path = opts.model_dir
    if not model_dir.is_dir():
        raise CalibrationError(f"{model_dir}: model directory not found")
    try:
        config = load_config(model_dir)
    except CheckpointError as exc:
        raise CalibrationError(str(exc)) from None
    mtype = text_config(config).get("model_type") or config.get("model_type")
    if mtype not in SUPPORTED:
        raise CalibrationError(
            f"{model_dir / 'config.json'}: model_type {mtype!r} is not supported "
            f"(supported: {', '.join(sorted(SUPPORTED))})"
        )
    attention = SUPPORTED[mtype]
    if (attention == "mla") != is_mla(config):
        raise CalibrationError(
            f"{model_dir / 'config.json'}: model_type {mtype} but kv_lora_rank "
            f"{'missing' if attention == 'mla' else 'present'}"
        )
    try:
        num_layers(config, str(model_dir / "config.json"))
    except CheckpointError as exc:
        raise CalibrationError(str(exc)) from None
    lo, hi = MAX_TOKENS_RANGE
    if not lo <= opts.max_tokens <= hi:
        raise CalibrationError(f"--max-tokens {opts.max_tokens} is out of range [{lo}, {hi}]")
    if not opts.headroom >= 1.0 or opts.headroom > 4.0:
        raise CalibrationError(f"--headroom {opts.headroom} is out of range [1.0, 4.0]")
    if opts.seed < 0:
        raise CalibrationError(f"--seed {opts.seed} must be >= 0")
    prompts = load_prompts(opts.prompts)
    if not 1 <= opts.num_prompts <= len(prompts):
        raise CalibrationError(
            f"--num-prompts {opts.num_prompts} is out of range [1, {len(prompts)}] "
            f"({opts.prompts} holds {len(prompts)})"
        )
    if opts.output.exists() and opts.output.is_dir():
        raise CalibrationError(f"--output {opts.output} is a directory")
    if opts.overlay is not None:
        try:
            check_overlay_target(model_dir, opts.overlay, opts.force)
        except CheckpointError as exc:
            raise CalibrationError(f"--overlay: {exc}") from None
    return config, attention, prompts


# ------------------------------------------------------------------ run
def calibrate(
    model_dir: Path,
    attention: Attention,
    prompts: Sequence[Prompt],
    max_tokens: int,
    seed: int,
    dtype: str = "auto",
    headroom: float = DEFAULT_HEADROOM,
    device: str = "cpu",
    prompts_file: Path | None = None,
    trust_remote_code: bool = False,
) -> KvScales:
    """Run ``prompts`` through the model and return the measured scales."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    kwargs: dict[str, Any] = {
        "dtype": "auto" if dtype == "auto" else getattr(torch, dtype),
        "trust_remote_code": trust_remote_code,
    }
    if device == "auto":  # spread over every GPU (and host memory): a 1T-parameter model fits no single device
        model = AutoModelForCausalLM.from_pretrained(model_dir, device_map="auto", **kwargs).eval()
        device = str(model.get_input_embeddings().weight.device)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs).to(device).eval()
    mla = attention == "mla"
    tokens = 0
    try:
        with torch.inference_mode(), KvCapture(model, mla) as cap:
            for p in prompts:
                ids = encode(tok, p.text, max_tokens)
                if not ids:
                    continue
                model(torch.tensor([ids], device=device), use_cache=False)
                tokens += len(ids)
            cap.check_complete()
    except KvCaptureError as exc:
        raise CalibrationError(f"{model_dir}: {exc}") from None
    layers = tuple(
        LayerScale(index=i, k_amax=max(m.latent, m.rope), latent_amax=m.latent, rope_amax=m.rope)
        if mla
        else LayerScale(index=i, k_amax=m.k, v_amax=m.v)
        for i, m in enumerate(cap.layers)
    )
    pf = prompts_file or DEFAULT_PROMPTS
    provenance = {
        "model_dir": portable(model_dir),
        "prompts_file": portable(pf),
        "prompts_sha256": sha256_file(pf) if pf.is_file() else None,
        "prompt_ids": [p.id for p in prompts],
        "categories": {c: sum(p.category == c for p in prompts) for c in sorted({p.category for p in prompts})},
        "max_tokens": max_tokens,
        "seed": seed,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date_utc": utc_now(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "seconds": round(time.monotonic() - t0, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    return KvScales(
        attention=attention,
        layers=layers,
        headroom=headroom,
        tokens=tokens,
        prompts=len(prompts),
        provenance=provenance,
    )


# ------------------------------------------------------------------ report
def table_rows(scales: KvScales) -> list[dict[str, Any]]:
    """One row per layer: what the table shows and tests check. ``k_scale`` is the
    checkpoint scale in OCP e4m3fn units (the JSON's); ``k_scale_fnuz`` is the scale
    vLLM runs with on MI300X (e4m3fnuz) from a compressed-tensors overlay written for it."""
    rows = []
    runtime = [k for k, _ in scales.scales_for("e4m3fnuz")]
    for ly, (k, v), rt in zip(scales.layers, scales.checkpoint_scales(), runtime, strict=False):
        row: dict[str, Any] = {"layer": ly.index, "k_amax": ly.k_amax, "k_scale": k, "k_scale_fnuz": rt}
        if scales.attention == "mla":
            row.update(latent_amax=ly.latent_amax, rope_amax=ly.rope_amax)
        else:
            row.update(v_amax=ly.v_amax, v_scale=v)
        rows.append(row)
    return rows


def print_table(scales: KvScales, file: Any = None) -> None:
    mla = scales.attention == "mla"
    t = Table(
        title=f"KV scales ({scales.attention.upper()}, {scales.prompts} prompts, {scales.tokens} tokens, "
        f"headroom {scales.headroom})"
    )
    cols = (
        ["layer"]
        + (["latent amax", "rope amax"] if mla else [])
        + ["k amax"]
        + ([] if mla else ["v amax"])
        + ["k scale (ckpt e4m3fn)"]
        + ([] if mla else ["v scale (ckpt)"])
        + ["k scale e4m3fnuz (MI300X overlay)"]
    )
    for c in cols:
        t.add_column(c, justify="right")
    for r in table_rows(scales):
        cells = (
            [str(r["layer"])]
            + ([f"{r['latent_amax']:.4g}", f"{r['rope_amax']:.4g}"] if mla else [])
            + [f"{r['k_amax']:.4g}"]
            + ([] if mla else [f"{r['v_amax']:.4g}"])
            + [f"{r['k_scale']:.5g}"]
            + ([] if mla else [f"{r['v_scale']:.5g}"])
            + [f"{r['k_scale_fnuz']:.5g}"]
        )
        t.add_row(*cells)
    Console(file=file or sys.stdout, width=140).print(t)
