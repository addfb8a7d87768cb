"""Where the training pipeline computes: the GPU when torch sees one, else the CPU.

One place decides, so capture, train and eval agree, and the same config runs
on a CPU machine and on a GPU node unchanged (`train.device: "auto"`). ROCm
builds of torch answer `torch.cuda` too, so "cuda" means an MI300X there.
Under torchrun each rank takes the GPU of its LOCAL_RANK. `train.autocast:
"auto"` is bf16 autocast where the device computes bf16 natively: a GPU, or a
CPU with AMX or AVX-512 BF16 (measured at equal wall time on each: 1.37x the
steps per second of fp32 with AMX, `benchmarks/drafter/training-changes-3/`,
1.52x with AVX-512 BF16, `training-changes-5/`, and no lower held-out
acceptance on either). Elsewhere it is none: AVX2 CPUs have no native bf16,
so torch would emulate it slowly.
Checkpoints are always read onto the CPU first, so a run trained on a GPU
evaluates and exports anywhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import TrainConfigError
from ..fsio import cpuinfo_field, open_atomic
from .config import AUTOCAST, DEVICES


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def init_distributed(device: torch.device) -> tuple[int, int]:
    """(rank, world size): under torchrun (WORLD_SIZE > 1) the process group, once (nccl, which is rccl
    on ROCm, on GPUs; gloo on the CPU); one process is rank 0 of 1."""
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    if ws > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return (torch.distributed.get_rank() if ws > 1 else 0), ws


def resolve(name: str) -> torch.device:
    """train.device as a torch device."""
    if name not in DEVICES:
        raise TrainConfigError(f"train.device {name!r}: expected one of {', '.join(DEVICES)}")
    gpu = torch.cuda.is_available()
    if name == "cuda" and not gpu:
        raise TrainConfigError(f"train.device=cuda, but this torch ({torch.__version__}) sees no GPU; use auto or cpu")
    if name == "cpu" or not gpu:
        return torch.device("cpu")
    return torch.device("cuda", local_rank())


def describe(device: torch.device) -> str:
    """The device in words, for manifests: the GPU's name, or the CPU's model and whether it
    computes bf16 in hardware (what capture and training speed on a CPU depend on)."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)}, torch {torch.__version__})"
    bf16 = "native bf16" if native_bf16(device) else "no native bf16"
    return f"cpu ({cpu_model()}, {bf16}, torch {torch.__version__})"


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name as the kernel reports it, or "unknown CPU"."""
    return cpuinfo_field(cpuinfo, "model name") or "unknown CPU"


def memory_bytes(device: torch.device, meminfo: str = "/proc/meminfo") -> float:
    """What a run may hold on `device`: a GPU's total memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return float(line.split()[1]) * 1024
    raise TrainConfigError(f"{meminfo}: no MemAvailable line")


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matmuls in hardware (a GPU; a CPU with AMX tiles or AVX-512 BF16)."""
    if device.type == "cuda":
        return True
    # private, but what vLLM's CPU platform asks too; absent from an older torch means no
    probes = (getattr(torch.cpu, "_is_amx_tile_supported", None), getattr(torch.cpu, "_is_avx512_bf16_supported", None))
    return device.type == "cpu" and any(p is not None and bool(p()) for p in probes)


def autocast_enabled(device: torch.device, mode: str) -> bool:
    """Whether bf16 autocast is on for train.autocast on this device."""
    if mode not in AUTOCAST:
        raise TrainConfigError(f"train.autocast {mode!r}: expected one of {', '.join(AUTOCAST)}")
    return mode == "bfloat16" or (mode == "auto" and native_bf16(device))


def autocast(device: torch.device, mode: str) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_enabled(device, mode))


def load_to_cpu(path: Path) -> dict:
    """A checkpoint, every tensor on the CPU (RNG states must be; the model moves later)."""
    return torch.load(path, map_location="cpu", weights_only=False)


def atomic_save(obj_: object, path: Path) -> None:
    """torch.save, published atomically: a checkpoint is the old one or the whole new one."""
    with open_atomic(path) as f:
        torch.save(obj_, f)


@contextlib.contextmanager
def float32_matmul(precision: str) -> Iterator[None]:
    """torch's float32 matmul precision ("highest": no TF32) for a block, restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
