"""The vllm-router command line for a fleet (one place that knows its flags).

Flags as vllm-router 0.1.17 spells them. Health checks run every
`health_check_interval_secs` (vLLM's /health), so a dead replica leaves the
pool after about three intervals (--health-failure-threshold 3) and a
restarted one comes back after two good checks. Sessions are kept together
by `consistent_hash`, which in 0.1.17 hashes the `X-Session-ID` header (body
fields such as `user` are ignored for chat requests): the benchmark sends
that header per session.
"""

from __future__ import annotations

from .spec import Fleet

SESSION_HEADER = "X-Session-ID"


def router_argv(fleet: Fleet, executable: str = "vllm-router") -> list[str]:
    r = fleet.router
    return [
        executable,
        "--host",
        r.host,
        "--port",
        str(r.port),
        "--worker-urls",
        *[rep.base_url for rep in fleet.replicas],
        "--policy",
        r.policy,
        "--prometheus-host",
        r.host,
        "--prometheus-port",
        str(r.prometheus_port),
        "--health-check-interval-secs",
        str(r.health_check_interval_secs),
        "--log-level",
        r.log_level,
    ]


def router_url(fleet: Fleet) -> str:
    host = "127.0.0.1" if fleet.router.host in ("0.0.0.0", "::") else fleet.router.host
    return f"http://{host}:{fleet.router.port}"
