"""Combinations the recipe refuses before anything starts.

Each rule raises `ConfigError` naming the key to change and why, so a bad
config costs seconds, not a five-minute model load that crashes.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import backends
from ..paths import CONFIGS_DIR
from .schema import LOOPBACK_HOSTS

if TYPE_CHECKING:
    from .loader import Config

AITER_MAX_BATCHED_TOKENS = 32768
DFLASH_MLA_BLOCK_SIZE = 16
# vLLM flags the recipe renders itself; EXTRA_VLLM_ARGS may not repeat them.
RENDERED_FLAGS = (
    "--model", "--served-model-name", "--host", "--port", "--api-key", "--tensor-parallel-size",
    "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--gpu-memory-utilization",
    "--block-size", "--enforce-eager", "--kv-cache-dtype", "--dtype", "--trust-remote-code",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--speculative-config",
    "--attention-backend", "--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser",
)
MLA_MODEL_TYPES = ("deepseek_v3", "deepseek_v2", "kimi_k2", "kimi_k25")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


def model_is_mla(cfg: dict[str, Any]) -> bool:
    inner = cfg.get("text_config") or cfg
    return "kv_lora_rank" in inner or inner.get("model_type") in MLA_MODEL_TYPES


def draft_block_size(config: "Config") -> tuple[int | None, str]:
    """The drafter's block size and where it was read (checkpoint first)."""
    from .loader import ConfigError

    for key in ("DRAFT_MODEL_DIR", "DRAFT_CONFIG"):
        value = config[key]
        if not value:
            continue
        path = Path(value) / "config.json" if key == "DRAFT_MODEL_DIR" else Path(value)
        try:
            data = read_json(path)
        except ValueError as exc:
            raise ConfigError(key, f"unreadable drafter config: {exc}", config.sources[key]) from None
        if data is not None and "block_size" in data:
            return int(data["block_size"]), str(path)
    return None, ""


def check(config: "Config") -> None:
    from .loader import ConfigError

    v, src = config.values, config.sources

    def fail(key: str, message: str) -> None:
        raise ConfigError(key, message, src.get(key, ""))

    if v["HOST"] not in LOOPBACK_HOSTS and not v["API_KEY"]:
        fail("HOST", f"binding to {v['HOST']} exposes the server; set API_KEY in the process environment "
                     "(export API_KEY=...) or keep HOST=127.0.0.1")
    if v["API_KEY"] and config.path is not None and src["API_KEY"] != "process environment":
        if Path(src["API_KEY"]).resolve().is_relative_to(CONFIGS_DIR):
            fail("API_KEY", "a key in a shipped config would be committed; export API_KEY=... instead")

    if v["MOE_BACKEND"] == "aiter" and v["MAX_NUM_BATCHED_TOKENS"] > AITER_MAX_BATCHED_TOKENS:
        fail("MAX_NUM_BATCHED_TOKENS",
             f"{v['MAX_NUM_BATCHED_TOKENS']} > {AITER_MAX_BATCHED_TOKENS} with MOE_BACKEND=aiter: above this "
             "AITER switches Kimi's 384-expert MoE to a fused gate that needs a power-of-two expert count and the "
             "kernel grid overflows; stay at 32768 or set MOE_BACKEND=triton")

    if v["SPECULATIVE_METHOD"] == "dflash":
        if not v["DRAFT_MODEL_DIR"]:
            fail("DRAFT_MODEL_DIR", "SPECULATIVE_METHOD=dflash needs the drafter checkpoint directory")
        block, where = draft_block_size(config)
        k = v["NUM_SPECULATIVE_TOKENS"]
        if block is not None and not 1 <= k <= block:
            fail("NUM_SPECULATIVE_TOKENS", f"{k} is outside 1..{block}, the drafter's block size ({where})")
        target_mla = v["TARGET_ATTENTION"] == "mla"
        if target_mla and v["BLOCK_SIZE"] != DFLASH_MLA_BLOCK_SIZE:
            fail("BLOCK_SIZE", f"{v['BLOCK_SIZE']} with DFlash and an MLA target; the MLA kernels and the "
                               f"drafter's attention only share block size {DFLASH_MLA_BLOCK_SIZE}: set BLOCK_SIZE=16")
    refused = backends.refusal(v)
    if refused:
        fail(*refused)
    if v["SPECULATIVE_METHOD"] == "ngram" and v["NGRAM_PROMPT_LOOKUP_MIN"] > v["NGRAM_PROMPT_LOOKUP_MAX"]:
        fail("NGRAM_PROMPT_LOOKUP_MIN", "must not exceed NGRAM_PROMPT_LOOKUP_MAX")

    try:
        target_cfg = read_json(Path(v["MODEL_DIR"]) / "config.json") if v["MODEL_DIR"] else None
    except ValueError as exc:
        fail("MODEL_DIR", f"unreadable target config: {exc}")
    if target_cfg is not None:
        actual = "mla" if model_is_mla(target_cfg) else "standard"
        if actual != v["TARGET_ATTENTION"]:
            fail("TARGET_ATTENTION", f"is {v['TARGET_ATTENTION']} but {v['MODEL_DIR']}/config.json describes "
                                     f"a {actual} model; set TARGET_ATTENTION={actual}")

    fp8 = v["KV_CACHE_DTYPE"].startswith("fp8")
    if fp8 and v["KV_SCALE_POLICY"] == "none":
        fail("KV_SCALE_POLICY", f"KV_CACHE_DTYPE={v['KV_CACHE_DTYPE']} without scales clips K/V at scale 1.0 and "
                                "degrades output (Kimi K2.6 ships no KV scales); set KV_SCALE_POLICY=running-max")
    if not fp8 and v["KV_SCALE_POLICY"] != "none":
        fail("KV_SCALE_POLICY", f"{v['KV_SCALE_POLICY']} applies only to an FP8 KV cache; set KV_CACHE_DTYPE=fp8 "
                                "or KV_SCALE_POLICY=none")

    if v["PLATFORM"] == "cpu" and v["MOE_BACKEND"] != "auto":
        fail("MOE_BACKEND", "AITER and Triton MoE are ROCm kernels; set MOE_BACKEND=auto with PLATFORM=cpu")

    try:
        extra = shlex.split(v["EXTRA_VLLM_ARGS"])
    except ValueError as exc:
        fail("EXTRA_VLLM_ARGS", f"cannot be split as shell words: {exc}")
    for word in extra:
        flag = word.split("=", 1)[0]
        if flag in RENDERED_FLAGS:
            fail("EXTRA_VLLM_ARGS", f"repeats {flag}, which the recipe renders from its own key; "
                                    "set that key instead (see docs/configuration.md)")
