"""Preflight against fake /proc and /dev trees: the ROCm host logic without a ROCm host."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from kimidflash.config import load_config
from kimidflash.preflight import PreflightError, preflight
from kimidflash.settings import Settings

from ..support.helpers import CONFIGS, free_port, write_env


def fake_host(
    tmp_path: Path,
    gpus: int = 8,
    kfd: bool = True,
    numa: str | None = "1",
    flags: str = "fpu sse2 avx2 avx512f avx512bw",
) -> tuple[Path, Path]:
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "cpuinfo").write_text(
        "".join(f"processor\t: {i}\nvendor_id\t: AuthenticAMD\nflags\t\t: {flags}\n\n" for i in range(2))
    )
    (dev / "dri").mkdir(parents=True)
    if numa is not None:
        (proc / "sys" / "kernel" / "numa_balancing").write_text(numa + "\n")
    if kfd:
        (dev / "kfd").write_text("")
    for i in range(gpus):
        (dev / "dri" / f"card{i}").write_text("")
        (dev / "dri" / f"renderD{128 + i}").write_text("")
    return proc, dev


def rocm_config(tmp_path: Path, **extra: str):
    models = {}
    for key in ("MODEL_DIR", "DRAFT_MODEL_DIR"):
        d = tmp_path / key.lower()
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(
            json.dumps({"model_type": "deepseek_v3", "kv_lora_rank": 512} if key == "MODEL_DIR" else {"block_size": 8})
        )
        models[key] = str(d)
    body = "\n".join(f"{k}={v}" for k, v in {**models, "PORT": str(free_port()), **extra}.items())
    return load_config(write_env(tmp_path / "c.env", f"INCLUDE={CONFIGS / 'production.env'}\n{body}\n"), environ={})


ROCM_CHECKS = {"/dev/kfd", "/dev/dri", "GPUs", "NUMA balancing", "MODEL_DIR", "DRAFT_MODEL_DIR", "port"}


def names(checks) -> dict[str, bool]:
    return {c.name: c.ok for c in checks}


def test_healthy_host_passes_and_root_disables_numa_balancing(tmp_path):
    proc, dev = fake_host(tmp_path, numa="1")
    checks = preflight(rocm_config(tmp_path), proc, dev, is_root=True)
    assert all(names(checks).values())
    assert set(names(checks)) == ROCM_CHECKS  # every ROCm host check ran, in one list
    assert (proc / "sys/kernel/numa_balancing").read_text().strip() == "0"
    assert "disabled it (read back 0)" in next(c.detail for c in checks if c.name == "NUMA balancing")


def test_numa_already_off_is_left_alone(tmp_path):
    proc, dev = fake_host(tmp_path, numa="0")
    checks = preflight(rocm_config(tmp_path), proc, dev, is_root=False)
    assert next(c for c in checks if c.name == "NUMA balancing").detail == "disabled"


def test_non_root_with_numa_on_is_refused_with_the_command(tmp_path):
    proc, dev = fake_host(tmp_path, numa="1")
    with pytest.raises(PreflightError) as exc:
        preflight(rocm_config(tmp_path), proc, dev, is_root=False)
    (failed,) = exc.value.failed
    assert failed.name == "NUMA balancing"
    assert "echo 0 > /proc/sys/kernel/numa_balancing" in failed.fix and "--allow-numa-balancing" in failed.fix
    assert (proc / "sys/kernel/numa_balancing").read_text().strip() == "1"


def test_explicit_override_lets_non_root_start(tmp_path):
    proc, dev = fake_host(tmp_path, numa="1")
    checks = preflight(rocm_config(tmp_path), proc, dev, is_root=False, allow_numa_balancing=True)
    assert "allowed by --allow-numa-balancing" in next(c.detail for c in checks if c.name == "NUMA balancing")


def test_root_whose_write_does_not_stick_is_refused(tmp_path, monkeypatch):
    proc, dev = fake_host(tmp_path, numa="1")
    config = rocm_config(tmp_path)
    monkeypatch.setattr(Path, "write_text", lambda self, text: len(text))  # a knob that ignores writes
    with pytest.raises(PreflightError, match="wrote 0 but read back 1"):
        preflight(config, proc, dev, is_root=True)


def test_kernel_without_numa_balancing_is_fine(tmp_path):
    proc, dev = fake_host(tmp_path, numa=None)
    checks = preflight(rocm_config(tmp_path), proc, dev, is_root=False)
    assert all(names(checks).values())
    assert set(names(checks)) == ROCM_CHECKS


@pytest.mark.parametrize(
    "kwargs, failing",
    [
        ({"kfd": False}, {"/dev/kfd"}),
        ({"gpus": 4}, {"GPUs"}),
        ({"gpus": 0}, {"GPUs"}),
    ],
)
def test_missing_devices_and_too_few_gpus(tmp_path, kwargs, failing):
    proc, dev = fake_host(tmp_path, numa="0", **kwargs)
    with pytest.raises(PreflightError) as exc:
        preflight(rocm_config(tmp_path), proc, dev, is_root=True)
    assert {c.name for c in exc.value.failed} == failing


@pytest.mark.parametrize("gpus, fix", [(4, "lower TENSOR_PARALLEL_SIZE to 4 or"), (0, "no GPU is visible")])
def test_too_few_gpus_get_a_fix_that_fits_and_none_is_never_told_to_lower_tp_to_zero(tmp_path, gpus, fix):
    proc, dev = fake_host(tmp_path, numa="0", gpus=gpus)
    with pytest.raises(PreflightError) as exc:
        preflight(rocm_config(tmp_path), proc, dev, is_root=True)
    (failed,) = exc.value.failed
    assert fix in failed.fix and "TENSOR_PARALLEL_SIZE to 0" not in failed.fix


def test_missing_dri_counts_as_missing_and_zero_gpus(tmp_path):
    proc, dev = fake_host(tmp_path, numa="0")
    for p in (dev / "dri").iterdir():
        p.unlink()
    (dev / "dri").rmdir()
    with pytest.raises(PreflightError) as exc:
        preflight(rocm_config(tmp_path), proc, dev, is_root=True)
    assert {c.name for c in exc.value.failed} == {"/dev/dri", "GPUs"}


def test_tp4_on_four_gpus_passes(tmp_path):
    proc, dev = fake_host(tmp_path, numa="0", gpus=4)
    checks = preflight(rocm_config(tmp_path, TENSOR_PARALLEL_SIZE="4"), proc, dev, is_root=True)
    assert names(checks) == dict.fromkeys(ROCM_CHECKS, True)
    assert next(c for c in checks if c.name == "GPUs").detail == "4 render nodes for TENSOR_PARALLEL_SIZE=4"


def test_model_dir_without_config_json_and_busy_port(tmp_path):
    proc, dev = fake_host(tmp_path, numa="0")
    config = rocm_config(tmp_path)
    (Path(config.draft_model_dir) / "config.json").unlink()
    with socket.socket() as s:
        s.bind(("127.0.0.1", config.port))
        s.listen()
        with pytest.raises(PreflightError) as exc:
            preflight(config, proc, dev, is_root=True)
    assert {c.name for c in exc.value.failed} == {"DRAFT_MODEL_DIR", "port"}


def test_cpu_platform_skips_rocm_checks(tmp_path):
    proc, dev = fake_host(tmp_path, kfd=False, gpus=0, numa="1")
    config = load_config(
        write_env(
            tmp_path / "cpu.env",
            f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\nPORT={free_port()}\nMODEL_DIR={tmp_path}\nSPECULATIVE_METHOD=none\n",
        ),
        environ={},
    )
    (tmp_path / "config.json").write_text("{}")
    assert set(names(preflight(config, proc, dev, is_root=False))) == {"MODEL_DIR", "port"}


def _time_wait_on(port: int) -> None:
    """Leave a connection in TIME_WAIT on `port`, as a stopped server that had clients does."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server closes first: its side of the connection enters TIME_WAIT
        client.recv(1)
        client.close()


def test_port_in_time_wait_is_free_but_a_listener_on_any_address_is_not(tmp_path):
    proc, dev = fake_host(tmp_path, numa="0")
    config = rocm_config(tmp_path)
    port = config.port
    _time_wait_on(port)
    # the kernel really holds the port: a bind without SO_REUSEADDR fails
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    assert names(preflight(config, proc, dev, is_root=True))["port"]
    with socket.socket() as s:  # a listener on the wildcard address takes 127.0.0.1 too
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen()
        with pytest.raises(PreflightError) as exc:
            preflight(config, proc, dev, is_root=True)
    assert [c.name for c in exc.value.failed] == ["port"]


def _cpu_fp8_config(tmp_path: Path, model_dir: Path, policy: str = "checkpoint"):
    dtype = "auto" if policy == "none" else "fp8"
    return load_config(
        write_env(
            tmp_path / "fp8.env",
            f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\nPORT={free_port()}\n"
            f"MODEL_DIR={model_dir}\nSPECULATIVE_METHOD=none\nKV_CACHE_DTYPE={dtype}\n"
            f"KV_SCALE_POLICY={policy}\n",
        ),
        environ={},
    )


def test_checkpoint_policy_refuses_a_model_dir_without_loadable_scales(tmp_path):
    from ..fp8.test_fp8_checkpoint import make_checkpoint

    proc, dev = fake_host(tmp_path, kfd=False, gpus=0, numa="0")
    src, _ = make_checkpoint(tmp_path / "m", layers=2)
    with pytest.raises(PreflightError) as exc:
        preflight(_cpu_fp8_config(tmp_path, src), proc, dev, is_root=False)
    (failed,) = exc.value.failed
    assert failed.name == "KV scales" and "no quantization_config" in failed.detail and "--overlay" in failed.fix
    # the same checkpoint passes with a cache that needs no scales
    assert "KV scales" not in names(preflight(_cpu_fp8_config(tmp_path, src, "none"), proc, dev, is_root=False))


def test_checkpoint_policy_passes_an_overlay_and_refuses_a_broken_one(tmp_path):
    from kimidflash.fp8.checkpoint import SHARD, write_overlay
    from kimidflash.safetensors_io import encode_f32_scalars

    from ..fp8.test_fp8_checkpoint import make_checkpoint, mha_scales

    proc, dev = fake_host(tmp_path, kfd=False, gpus=0, numa="0")
    src, _ = make_checkpoint(tmp_path / "m", layers=2)
    out = write_overlay(src, mha_scales(2), tmp_path / "m-kv", fmt="e4m3fn")  # the CPU build stores e4m3fn
    checks = preflight(_cpu_fp8_config(tmp_path, out), proc, dev, is_root=False)
    assert next(c for c in checks if c.name == "KV scales").detail.startswith("2 MHA layers with KV scales for e4m3fn")
    (out / SHARD).write_bytes(
        encode_f32_scalars(
            {
                "model.layers.0.self_attn.k_scale": 0.1,
                "model.layers.0.self_attn.v_scale": 0.1,
                "model.layers.1.self_attn.k_scale": 0.1,
                "model.layers.1.self_attn.v_scale": float("nan"),
            }
        )
    )
    with pytest.raises(PreflightError, match=r"layer 1 tensor model.layers.1.self_attn.v_scale = nan"):
        preflight(_cpu_fp8_config(tmp_path, out), proc, dev, is_root=False)


def test_checkpoint_policy_refuses_an_overlay_written_for_another_fp8_format(tmp_path):
    from kimidflash.fp8.checkpoint import write_overlay

    from ..fp8.test_fp8_checkpoint import make_checkpoint, mha_scales

    proc, dev = fake_host(tmp_path, kfd=False, gpus=0, numa="0")
    src, _ = make_checkpoint(tmp_path / "m", layers=2)
    out = write_overlay(src, mha_scales(2), tmp_path / "m-kv", fmt="e4m3fnuz")  # for MI300X, served on CPU
    with pytest.raises(PreflightError) as exc:
        preflight(_cpu_fp8_config(tmp_path, out), proc, dev, is_root=False)
    (failed,) = exc.value.failed
    assert "scales written for e4m3fnuz but PLATFORM=cpu stores e4m3fn" in failed.detail
    assert failed.fix == "rewrite the overlay with --kv-format e4m3fn"


@pytest.mark.parametrize(
    "flags, fp8, refused",
    [
        ("fpu sse2 avx2", True, True),  # a Zen 3 EPYC: AVX2 only
        ("fpu avx2 avx512f", True, False),
        ("fpu avx2 amx_tile", True, False),
        ("fpu sse2 avx2", False, False),  # nothing in FP8: the flags are not read
        ("", True, True),  # no flags line (not x86): refused too
    ],
)
def test_an_fp8_kv_cache_on_cpu_needs_avx512_or_amx(tmp_path, flags, fp8, refused):
    from kimidflash.fp8.checkpoint import write_overlay

    from ..fp8.test_fp8_checkpoint import make_checkpoint, mha_scales

    proc, dev = fake_host(tmp_path, kfd=False, gpus=0, numa="0", flags=flags)
    src, _ = make_checkpoint(tmp_path / "m", layers=2)
    overlay = write_overlay(src, mha_scales(2), tmp_path / "m-kv", fmt="e4m3fn")
    config = _cpu_fp8_config(tmp_path, overlay if fp8 else src, "checkpoint" if fp8 else "none")
    if not refused:
        checks = names(preflight(config, proc, dev, is_root=False))
        assert checks.get("FP8 KV on CPU", True) and ("FP8 KV on CPU" in checks) == fp8
        return
    with pytest.raises(PreflightError) as exc:
        preflight(config, proc, dev, is_root=False)
    (failed,) = exc.value.failed
    assert failed.name == "FP8 KV on CPU" and failed.detail.startswith("KV_CACHE_DTYPE=fp8: ")
    assert "AVX-512 or AMX" in failed.detail and str(proc / "cpuinfo") in failed.detail
    assert "KV_CACHE_DTYPE=auto" in failed.fix


def test_a_dflash_drafts_fp8_cache_is_checked_even_beside_an_mla_target(tmp_path):
    """The draft's layers use CPU_ATTN whatever the target's attention is."""
    from kimidflash.preflight import check_cpu_fp8_kv

    proc, _ = fake_host(tmp_path, kfd=False, gpus=0, flags="fpu avx2")
    base = Settings(platform="cpu", speculative_method="dflash", target_attention="mla", kv_cache_dtype="fp8")
    assert check_cpu_fp8_kv(replace(base, draft_kv_cache_dtype="auto"), proc) == []  # the MLA cache is CPU_MLA's
    (failed,) = check_cpu_fp8_kv(replace(base, draft_kv_cache_dtype="fp8"), proc)
    assert not failed.ok and failed.detail.startswith("DRAFT_KV_CACHE_DTYPE=fp8: ")
    (both,) = check_cpu_fp8_kv(replace(base, target_attention="standard", draft_kv_cache_dtype="fp8"), proc)
    assert both.detail.startswith("KV_CACHE_DTYPE=fp8 and DRAFT_KV_CACHE_DTYPE=fp8: ")


@pytest.mark.parametrize(
    "nodes, bind, failing",
    [
        (1, "", True),  # vLLM's auto binding wants a NUMA node per rank
        (2, "", False),
        (1, "auto", True),
        (1, "0|1", False),  # explicit lists: vLLM binds as told
        (1, "nobind", False),
    ],
)
def test_cpu_tensor_parallel_needs_a_numa_node_per_rank_or_cpu_lists(tmp_path, nodes, bind, failing):
    proc, dev = fake_host(tmp_path, kfd=False, gpus=0)
    sys_root = tmp_path / "sys"
    for n in range(nodes):
        (sys_root / "devices" / "system" / "node" / f"node{n}").mkdir(parents=True)
    (tmp_path / "config.json").write_text("{}")
    config = load_config(
        write_env(
            tmp_path / "cpu.env",
            f"INCLUDE={CONFIGS / 'cpu-tiny.env'}\nPORT={free_port()}\n"
            f"MODEL_DIR={tmp_path}\nSPECULATIVE_METHOD=none\nTENSOR_PARALLEL_SIZE=2\n"
            f"CPU_OMP_THREADS_BIND={bind}\n",
        ),
        environ={},
    )
    if not failing:
        assert names(preflight(config, proc, dev, is_root=False, sys_root=sys_root)).get("CPU binding", True)
        return
    with pytest.raises(PreflightError) as exc:
        preflight(config, proc, dev, is_root=False, sys_root=sys_root)
    (failed,) = exc.value.failed
    assert failed.name == "CPU binding" and f"{nodes} NUMA node(s)" in failed.detail
    assert "CPU_OMP_THREADS_BIND=" in failed.fix
