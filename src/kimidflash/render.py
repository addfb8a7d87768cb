"""Turn a validated config into the exact vLLM command line and environment.

vLLM's flag names live in the schema (each key names its flag); this module
decides how values become words, so a change to what the recipe runs is one
visible diff in the golden files under tests/golden/.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from .backends import (
    DRAFT_MODEL_METHODS,
    attention_plan,
    draft_kv_dtype_option,
    per_draft_option,
    tool_strict_level_option,
)
from .config import Config, draft_schedule, hidden_states_layers
from .settings import BY_NAME, FLAG_ORDER, Field

FP8_POLICY_ENV = "KIMIDFLASH_FP8_KV_SCALE"  # read by the FP8 KV patch inside vLLM
FP8_SCALES_ENV = "KIMIDFLASH_FP8_KV_SCALES"  # its seed: a kimidflash calibrate scales JSON
PIN_ENV = "KIMIDFLASH_VLLM_VERSION"  # checked by the launcher against the installed vLLM
SECRET_ENV = ("VLLM_API_KEY",)


@dataclass(frozen=True)
class Rendered:
    argv: list[str]
    env: dict[str, str]

    def shell(self, mask_secrets: bool = True) -> str:
        """A copy-pasteable `VAR=... vllm serve MODEL --flag value ...` command, one flag per line."""
        lines = [f"{k}={shlex.quote('***' if mask_secrets and k in SECRET_ENV else v)}" for k, v in self.env.items()]
        group: list[str] = []
        for arg in self.argv:
            if arg.startswith("--") and group:
                lines.append(shlex.join(group))
                group = []
            group.append(arg)
        lines.append(shlex.join(group))
        return " \\\n  ".join(lines)


def speculative_config(config: Config) -> dict[str, object] | None:
    v = config
    method = v.speculative_method
    if method == "none":
        return None
    spec: dict[str, object] = {"method": method}
    if method == "extract_hidden_states":
        # vLLM captures the stream entering aux layer i, i.e. the output of layer i - 1.
        aux = [layer + 1 for layer in hidden_states_layers(v.hidden_states_layers)]
        return {
            **spec,
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": aux}},
        }
    drafts = method in DRAFT_MODEL_METHODS  # a draft checkpoint: DFlash or EAGLE-3
    if drafts:
        spec["model"] = v.draft_model_dir
    spec["num_speculative_tokens"] = v.num_speculative_tokens
    if drafts and v.num_speculative_tokens_per_batch_size:  # the rules refused it on pins without
        spec["num_speculative_tokens_per_batch_size"] = [
            list(r) for r in draft_schedule(v.num_speculative_tokens_per_batch_size)
        ]
    if method == "ngram":
        spec["prompt_lookup_max"] = v.ngram_prompt_lookup_max
        spec["prompt_lookup_min"] = v.ngram_prompt_lookup_min
    if drafts and v.draft_attention_backend and per_draft_option(v.vllm_version):
        # Before 0.21 vLLM has no such key (and refuses unknown ones); the validator
        # accepts only the backend that pin picks itself (backends.attention_plan).
        spec["attention_backend"] = v.draft_attention_backend
    if drafts and v.draft_kv_cache_dtype and draft_kv_dtype_option(v.vllm_version):
        spec["kv_cache_dtype"] = v.draft_kv_cache_dtype
    return spec


def flag_words(f: Field, value: object) -> list[str]:
    """One key's words on the command line: `--flag value`, a bare `--flag` for a
    boolean, nothing for a value vLLM already defaults to."""
    if f.kind == "bool":
        flag = f.flag if value else f.flag_off
        return [flag] if flag else []
    if value in f.omit:
        return []
    word = f"{value:g}" if f.kind == "float" else str(value)
    return [*f.also, f.flag, word]


def vllm_argv(config: Config) -> list[str]:
    v = config
    model = v.presharded_dir or v.model_dir  # the shards' folder holds the config and tokenizer too
    if v.vllm_entrypoint == "cli":
        argv = ["vllm", "serve", model]
    else:
        argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", BY_NAME["MODEL_DIR"].flag, model]
    if v.presharded_dir:
        argv += [BY_NAME["PRESHARDED_DIR"].flag, "sharded_state"]
    for key in FLAG_ORDER:
        argv += flag_words(BY_NAME[key], v.value(key))
    if v.tool_strict_level and tool_strict_level_option(v.vllm_version):  # older pins: no such flag
        argv += [BY_NAME["TOOL_STRICT_LEVEL"].flag, v.tool_strict_level]
    spec = speculative_config(config)
    if spec is not None:
        argv += [BY_NAME["SPECULATIVE_METHOD"].flag, json.dumps(spec, separators=(",", ":"))]
        if v.spec_decode_metrics != "none":
            argv += [BY_NAME["SPEC_DECODE_METRICS"].flag, v.spec_decode_metrics]
    if v.speculative_method == "extract_hidden_states":
        connector = {
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": v.hidden_states_dir},
        }
        argv += [BY_NAME["HIDDEN_STATES_DIR"].flag, json.dumps(connector, separators=(",", ":"))]
    argv += shlex.split(v.extra_vllm_args)
    return argv


def vllm_env(config: Config) -> dict[str, str]:
    v = config
    env: dict[str, str] = {PIN_ENV: v.vllm_version}
    if v.platform == "rocm":
        env["HIP_FORCE_DEV_KERNARG"] = "1"
        env["SAFETENSORS_FAST_GPU"] = "1"
        if v.moe_backend != "auto":
            env["VLLM_ROCM_USE_AITER"] = "1"
            env["VLLM_ROCM_USE_AITER_MOE"] = "1" if v.moe_backend == "aiter" else "0"
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(v.cpu_kvcache_space)
        if v.cpu_omp_threads_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = v.cpu_omp_threads_bind
    if v.kv_scale_policy == "running-max":
        env[FP8_POLICY_ENV] = "running-max"
        if v.kv_scales_file:
            env[FP8_SCALES_ENV] = v.kv_scales_file
    if v.hf_home:
        env["HF_HOME"] = v.hf_home
    if v.api_key:
        env["VLLM_API_KEY"] = v.api_key
    return env


DRAFT_LABEL = {"dflash": "DFlash draft", "eagle3": "EAGLE-3 head"}


def attention_line(config: Config) -> str:
    """Which attention backend the target and the draft get, and how."""
    plan = attention_plan(config)
    line = f"attention: target {f'{plan.target} ({plan.target_how})' if plan.target else 'chosen by vLLM'}"
    if plan.draft is not None:
        label = DRAFT_LABEL[config.speculative_method]
        line += f"; {label} {f'{plan.draft} ({plan.draft_how})' if plan.draft else 'chosen by vLLM'}"
    return line.replace("`", "")


def render(config: Config) -> Rendered:
    return Rendered(vllm_argv(config), vllm_env(config))
