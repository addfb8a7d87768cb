"""`kimidflash build`'s command line: its options parsed and checked, then `build.py` called."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cliargs import add_set
from ..config import load_config
from ..errors import UsageError
from ..paths import REPO_ROOT
from .build import _log, build_image, print_report
from .cpu_base import ensure_cpu_base
from .engine import require_client


def main(argv: list[str] | None = None) -> int:
    """Build the recipe image from a config's pins (exit 2: no Docker engine)."""
    p = argparse.ArgumentParser(prog="kimidflash build", description=main.__doc__)
    p.add_argument(
        "config",
        nargs="?",
        default=str(REPO_ROOT / "configs" / "production.env"),
        help="env config whose VLLM_VERSION / VLLM_IMAGE / PLATFORM pick the base (default: configs/production.env)",
    )
    add_set(p, "override a config key")
    p.add_argument("--name", help="image name (default: the config's IMAGE_NAME)")
    p.add_argument("--base-image", help="BASE_IMAGE (default: VLLM_IMAGE, or the local CPU base when PLATFORM=cpu)")
    p.add_argument("--ca-bundle", type=Path, help="CA bundle for a TLS-intercepting proxy, passed as a BuildKit secret")
    p.add_argument("--patch-set", type=Path, help="build with another patch-set file (drift tests)")
    p.add_argument("--no-cache", action="store_true")
    args = p.parse_args(argv)

    for label, path in (("--ca-bundle", args.ca_bundle), ("--patch-set", args.patch_set)):
        if path is not None and not path.is_file():
            raise UsageError(f"{label} {path}: no such file")
    config = load_config(args.config, args.set)
    client = require_client()
    vllm_version = config.vllm_version
    base = args.base_image
    if not base:
        base = ensure_cpu_base(client, vllm_version, log=_log) if config.platform == "cpu" else config.vllm_image
    result = build_image(
        client,
        base_image=base,
        vllm_version=vllm_version,
        name=args.name or config.image_name,
        ca_bundle=args.ca_bundle,
        patch_set=args.patch_set,
        nocache=args.no_cache,
    )
    print_report(result)
    return 0
