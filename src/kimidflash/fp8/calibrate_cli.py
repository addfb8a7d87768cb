"""`kimidflash calibrate`'s command line: its options parsed and checked, then `calibrate.py` called."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cliargs import options
from ..formats.fp8 import DEFAULT_HEADROOM
from . import calibrate as _domain
from .calibrate import DEFAULT_PROMPTS, DTYPES, CalibrateOptions, calibrate, check_inputs, print_table, select
from .checkpoint import write_overlay


# ------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kimidflash calibrate", description=_domain.__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="Hugging Face checkpoint directory")
    ap.add_argument(
        "--output", "-o", type=Path, default=Path("kv-scales.json"), help="scales JSON (default %(default)s)"
    )
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="JSONL prompt set (id, category, prompt)")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=4096, help="tokens per prompt, cut after the chat template")
    ap.add_argument("--seed", type=int, default=0, help="chooses and orders the prompts")
    ap.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: the checkpoint's dtype (what vLLM serves)")
    ap.add_argument(
        "--device",
        default="cpu",
        help="torch device: cpu, cuda (one GPU; ROCm too), or auto (accelerate's device_map over all GPUs)",
    )
    ap.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM)
    ap.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let transformers run the checkpoint's own modeling code (multimodal wrappers such as Kimi K2.6)",
    )
    ap.add_argument("--overlay", type=Path, help="also write a checkpoint overlay vLLM serves with the scales")
    ap.add_argument("--force", action="store_true", help="replace a non-empty --overlay directory")
    ap.add_argument(
        "--kv-format",
        choices=("e4m3fnuz", "e4m3fn"),
        default="e4m3fnuz",
        help="FP8 format of the platform serving the overlay: e4m3fnuz for MI300X/MI325X (gfx94x), "
        "e4m3fn for gfx950, CUDA and CPU (default %(default)s: never clips anywhere)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = options(CalibrateOptions, build_parser().parse_args(argv))
    _, attention, prompts = check_inputs(args)
    chosen = select(prompts, args.num_prompts, args.seed)
    scales = calibrate(
        args.model_dir,
        attention,
        chosen,
        args.max_tokens,
        args.seed,
        args.dtype,
        args.headroom,
        args.device,
        args.prompts,
        args.trust_remote_code,
    )
    print_table(scales)
    if args.overlay is not None:
        out = write_overlay(args.model_dir, scales, args.overlay, force=args.force, fmt=args.kv_format)
        print(f"overlay: {out} (scales for {args.kv_format}; serve it as MODEL_DIR with KV_SCALE_POLICY=checkpoint)")
    scales.save(args.output)
    print(
        f"scales: {args.output} ({len(scales.layers)} layers, {scales.tokens} tokens, "
        f"{scales.provenance['seconds']} s, peak RSS {scales.provenance['peak_rss_mib']} MiB)"
    )
    return 0
