"""`python -m kimidflash fleet FLEET.toml`: replicas and vllm-router, up until Ctrl-C."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from ..background import sigterm_as_interrupt
from ..errors import EXIT_FAILED
from ..paths import cache_dir
from .router import SESSION_HEADER, router_argv, router_url
from .run import check_remotes, running_fleet
from .spec import Fleet, load_fleet


def curl_line(fleet: Fleet) -> str:
    model = next((r.served.served_model_name for r in fleet.local), "MODEL")
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Explain the Riemann hypothesis"}],
            "max_tokens": 128,
            "temperature": 0,
        }
    )
    auth = ' -H "Authorization: Bearer $API_KEY"' if any(r.served.api_key for r in fleet.local) else ""
    return (
        f"curl {router_url(fleet)}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-H '{SESSION_HEADER}: my-session'{auth} -d {shlex.quote(body)}"
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kimidflash fleet",
        description="start the fleet's local replicas and vllm-router in front of them; Ctrl-C stops everything",
    )
    p.add_argument("fleet", type=Path, help="the fleet file (TOML; see docs/fleet.md)")
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the file, check remote replicas, print the router command; start nothing",
    )
    p.add_argument("--log-dir", type=Path, default=None, help="replica and router logs (default: under the cache)")
    args = p.parse_args(argv)
    fleet = load_fleet(args.fleet)
    if args.check:
        check_remotes(fleet)
        for r in fleet.replicas:
            print(f"replica {r.name}: {r.base_url}" + (f" ({r.config_path})" if r.local else " (remote, checked)"))
        print("router: " + shlex.join(router_argv(fleet)))
        return 0
    log_dir = args.log_dir or cache_dir() / "fleet-logs" / fleet.path.stem
    with sigterm_as_interrupt():
        try:
            with running_fleet(fleet, log_dir) as procs:
                print(
                    f"fleet: ready: {router_url(fleet)}/v1 ({len(fleet.replicas)} replicas, policy "
                    f"{fleet.router.policy}); logs in {log_dir}; try:\n{curl_line(fleet)}",
                    flush=True,
                )
                reported: set[str] = set()
                while procs["router"].poll() is None:
                    for r in fleet.local:
                        if r.name not in reported and procs[r.name].poll() is not None:
                            reported.add(r.name)
                            sets = " ".join(f"--set {shlex.quote(o)}" for o in (*r.overrides, f"PORT={r.served.port}"))
                            print(
                                f"fleet: replica {r.name} exited {procs[r.name].returncode}; the router takes it "
                                f"out after its health checks fail and back once it answers again: "
                                f"python -m kimidflash serve {r.config_path} {sets}",
                                flush=True,
                            )
                    time.sleep(1.0)
                print(
                    f"fleet: vllm-router exited {procs['router'].returncode}; stopping the replicas "
                    f"(log {log_dir / 'router.log'})",
                    flush=True,
                )
                return EXIT_FAILED
        except KeyboardInterrupt:
            print("fleet: stopped", flush=True)
            return 0
