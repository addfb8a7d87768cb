"""The container the docker runtime starts, as one plain dict.

One dict feeds both the docker SDK (`client.containers.run(**spec)`) and the
`docker run` line `--dry-run` prints, so what users read is what runs. It
holds exactly what ROCm needs and nothing more: the two device nodes, the
video and render groups, host IPC, seccomp unconfined and SYS_PTRACE, host
networking; never privileged. Model and draft directories are mounted
read-only at the same path as on the host, so the argv rendered on the host
is valid inside the container unchanged. Golden files in tests/golden/docker/
pin it for every production config.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from ..backends import DRAFT_MODEL_METHODS
from ..config import Config
from ..paths import link_targets
from ..render import SECRET_ENV, Rendered

LAUNCHER_IN_IMAGE = "/opt/kimidflash/launchers/kimi26-vllm-dflash.sh"
ROCM_DEVICES = ("/dev/kfd", "/dev/dri")
ROCM_GROUPS = ("video", "render")
MANAGED_LABEL = "io.kimidflash.managed"


def container_name(config: Config) -> str:
    """Stable per served model and port: with host networking the port is exclusive anyway."""
    v = config
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(v.served_model_name)).strip("-.") or "server"
    return f"kimidflash-{safe}-{v.port}"


def mounts(config: Config) -> dict[str, dict[str, str]]:
    """Host path -> bind: model (and what an overlay links to), drafter, a KV scales file and a
    chat template read-only at the same path; HF cache writable."""
    v = config
    out: dict[str, dict[str, str]] = {v.model_dir: {"bind": v.model_dir, "mode": "ro"}}
    for target in link_targets(v.model_dir):
        out[target] = {"bind": target, "mode": "ro"}
    if v.presharded_dir:
        out[v.presharded_dir] = {"bind": v.presharded_dir, "mode": "ro"}
    if v.speculative_method in DRAFT_MODEL_METHODS and v.draft_model_dir:
        out[v.draft_model_dir] = {"bind": v.draft_model_dir, "mode": "ro"}
    if v.kv_scale_policy == "running-max" and v.kv_scales_file:
        out[v.kv_scales_file] = {"bind": v.kv_scales_file, "mode": "ro"}
    if v.chat_template:
        out[v.chat_template] = {"bind": v.chat_template, "mode": "ro"}
    if v.hf_home:
        out[v.hf_home] = {"bind": v.hf_home, "mode": "rw"}
    return dict(sorted(out.items()))


def container_spec(config: Config, rendered: Rendered, image: str) -> dict[str, Any]:
    """Keyword arguments for the docker SDK's containers.run/create (plus `image`)."""
    if not image or any(c.isspace() for c in image):
        raise ValueError(f"image reference {image!r} is empty or has spaces")
    env = dict(rendered.env)
    env["KIMIDFLASH_HEALTH_URL"] = f"{config.base_url}/health"  # the image's HEALTHCHECK reads it
    spec: dict[str, Any] = {
        "image": image,
        "name": container_name(config),
        "entrypoint": [LAUNCHER_IN_IMAGE],
        "command": ["--", *rendered.argv],
        "environment": dict(sorted(env.items())),
        "volumes": mounts(config),
        "network_mode": "host",
        "ipc_mode": "host",
        "init": True,  # tini as PID 1: SIGTERM reaches vLLM, `docker stop` does not hang
        "labels": {MANAGED_LABEL: "1", "io.kimidflash.served-model": str(config.served_model_name)},
    }
    if config.platform == "rocm":
        spec["devices"] = [f"{d}:{d}:rwm" for d in ROCM_DEVICES]
        spec["group_add"] = list(ROCM_GROUPS)
        spec["cap_add"] = ["SYS_PTRACE"]
        spec["security_opt"] = ["seccomp=unconfined"]
    return spec


def docker_run_line(spec: dict[str, Any]) -> str:
    """The exact `docker run` equivalent of `spec`; secrets pass through by name, never by value."""
    args: list[str] = ["docker", "run", "--rm", "--name", spec["name"]]
    if spec.get("init"):
        args.append("--init")
    if spec.get("network_mode"):
        args += ["--network", spec["network_mode"]]
    if spec.get("ipc_mode"):
        args += ["--ipc", spec["ipc_mode"]]
    for d in spec.get("devices", []):
        host, inside, _perm = d.split(":")
        args += ["--device", host if host == inside else f"{host}:{inside}"]
    for g in spec.get("group_add", []):
        args += ["--group-add", g]
    for c in spec.get("cap_add", []):
        args += ["--cap-add", c]
    for s in spec.get("security_opt", []):
        args += ["--security-opt", s]
    for host, bind in spec.get("volumes", {}).items():
        args += ["-v", f"{host}:{bind['bind']}:{bind['mode']}"]
    for k, v in spec.get("environment", {}).items():
        args += ["-e", k if k in SECRET_ENV else f"{k}={v}"]
    for k, v in spec.get("labels", {}).items():
        args += ["--label", f"{k}={v}"]
    if spec.get("entrypoint"):
        args += ["--entrypoint", spec["entrypoint"][0]]
    args.append(spec["image"])
    args += list(spec.get("entrypoint", [])[1:]) + list(spec.get("command", []))
    if spec.get("privileged"):
        raise ValueError("refusing a privileged container spec")
    parts = [shlex.quote(a) for a in args]
    # One option (with its value) per line, so a review diff shows what changed.
    lines, i = [], 0
    head = " ".join(parts[:2])
    i = 2
    while i < len(parts):
        if (
            parts[i].startswith("-")
            and i + 1 < len(parts)
            and not parts[i + 1].startswith("-")
            and parts[i] not in ("--rm", "--init")
        ):
            lines.append(f"{parts[i]} {parts[i + 1]}")
            i += 2
        elif parts[i].startswith("-") and parts[i] != "--":
            lines.append(parts[i])
            i += 1
        else:
            break
    tail = " ".join(parts[i:])
    return " \\\n  ".join([head, *lines, tail])
