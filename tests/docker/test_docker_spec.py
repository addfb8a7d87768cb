"""Container spec and `docker run` line: goldens for every production config,
and the ROCm/CPU rules the spec must keep (never privileged, read-only models)."""

from __future__ import annotations

import json
import shlex

import pytest

from kimidflash.config import load_config
from kimidflash.docker.spec import LAUNCHER_IN_IMAGE, container_spec, docker_run_line
from kimidflash.render import render

from ..support.helpers import CONFIGS, PRODUCTION_CONFIGS, ROOT, UPDATE_GOLDEN, write_env

GOLDEN = ROOT / "tests" / "golden" / "docker"
IMAGE = "kimidflash/kimi26-dflash:0.33.0-0123456789ab"


def spec_for(path, **overrides):
    config = load_config(path, overrides, environ={})
    return config, container_spec(config, render(config), IMAGE)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run UPDATE_GOLDEN=1 pytest tests/docker/test_docker_spec.py"
    assert text == path.read_text(), f"{path} differs; review, then UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", PRODUCTION_CONFIGS)
def test_spec_golden(name):
    _, spec = spec_for(CONFIGS / name)
    check_golden(name.replace(".env", ".spec.json"), json.dumps(spec, indent=2, sort_keys=True) + "\n")


@pytest.mark.parametrize("name", PRODUCTION_CONFIGS)
def test_run_line_golden(name):
    _, spec = spec_for(CONFIGS / name)
    check_golden(name.replace(".env", ".docker-run.txt"), docker_run_line(spec) + "\n")


def test_production_configs_exist():
    assert "production.env" in PRODUCTION_CONFIGS and len(PRODUCTION_CONFIGS) >= 2


@pytest.mark.parametrize("name", PRODUCTION_CONFIGS)
def test_rocm_spec_has_exactly_what_rocm_needs(name):
    config, spec = spec_for(CONFIGS / name)
    assert spec["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert spec["group_add"] == ["video", "render"]
    assert spec["ipc_mode"] == "host" and spec["network_mode"] == "host"
    assert spec["security_opt"] == ["seccomp=unconfined"] and spec["cap_add"] == ["SYS_PTRACE"]
    assert "privileged" not in spec and spec["init"] is True
    rendered = render(config)
    assert spec["entrypoint"] == [LAUNCHER_IN_IMAGE] and spec["command"] == ["--", *rendered.argv]
    for key, value in rendered.env.items():
        assert spec["environment"][key] == value
    v = config
    # Models at the same path, read-only, so the host-rendered argv holds inside.
    assert spec["volumes"][v.model_dir] == {"bind": v.model_dir, "mode": "ro"}
    assert spec["volumes"][v.draft_model_dir] == {"bind": v.draft_model_dir, "mode": "ro"}
    assert v.model_dir in rendered.argv


def test_cpu_spec_has_no_devices_or_groups():
    _, spec = spec_for(CONFIGS / "cpu-tiny.env")
    for key in ("devices", "group_add", "cap_add", "security_opt", "privileged"):
        assert key not in spec
    assert spec["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert all(b["mode"] == "ro" for b in spec["volumes"].values())


def test_hf_home_mounted_writable_and_ngram_has_no_draft_mount(tmp_path):
    cfg = write_env(
        tmp_path / "c.env", f"INCLUDE={CONFIGS / 'production.env'}\nHF_HOME=/data/hf\nSPECULATIVE_METHOD=ngram\n"
    )
    config, spec = spec_for(cfg)
    assert spec["volumes"]["/data/hf"] == {"bind": "/data/hf", "mode": "rw"}
    assert spec["environment"]["HF_HOME"] == "/data/hf"
    assert config.draft_model_dir not in spec["volumes"]


def test_api_key_never_printed_in_run_line(tmp_path):
    cfg = write_env(tmp_path / "c.env", f"INCLUDE={CONFIGS / 'production.env'}\n")
    config = load_config(cfg, {"API_KEY": "sk-very-secret", "HOST": "0.0.0.0"}, environ={})
    spec = container_spec(config, render(config), IMAGE)
    assert spec["environment"]["VLLM_API_KEY"] == "sk-very-secret"  # the SDK gets the value...
    line = docker_run_line(spec)
    assert "sk-very-secret" not in line  # ...the printed line passes it through by name
    assert "-e VLLM_API_KEY \\" in line
    assert spec["environment"]["KIMIDFLASH_HEALTH_URL"] == "http://127.0.0.1:8262/health"


def test_run_line_round_trips_to_the_spec():
    """Parsing the printed line back gives the spec's devices, mounts, env and command."""
    config, spec = spec_for(CONFIGS / "production.env")
    words = shlex.split(docker_run_line(spec).replace("\\\n", " "))
    assert words[:3] == ["docker", "run", "--rm"] and "--privileged" not in words
    image_at = words.index(IMAGE)
    assert words[image_at + 1 :] == spec["command"]
    opts = list(zip(words[3:image_at], words[4:image_at], strict=False))
    assert ("--device", "/dev/kfd") in opts and ("--device", "/dev/dri") in opts
    assert ("--entrypoint", LAUNCHER_IN_IMAGE) in opts
    env = dict(v.split("=", 1) for k, v in opts if k == "-e")
    assert {k: v for k, v in env.items()} == spec["environment"]
    mounts = {v for k, v in opts if k == "-v"}
    assert mounts == {f"{h}:{b['bind']}:{b['mode']}" for h, b in spec["volumes"].items()}


@pytest.mark.parametrize("image", ["", "has space:1"])
def test_bad_image_named(image):
    config = load_config(CONFIGS / "production.env", environ={})
    with pytest.raises(ValueError, match="image reference"):
        container_spec(config, render(config), image)


def test_privileged_spec_refused():
    _, spec = spec_for(CONFIGS / "production.env")
    with pytest.raises(ValueError, match="privileged"):
        docker_run_line({**spec, "privileged": True})


def test_an_overlay_mounts_the_checkpoint_it_links_and_the_scales_file(tmp_path):
    """A KV-scale overlay's relative links resolve inside the container only if the
    checkpoint beside it is mounted at the same path; a seed file is mounted too."""
    from kimidflash.formats.kv_scales import KvScales, LayerScale

    ckpt, overlay = tmp_path / "Kimi-K2.6", tmp_path / "Kimi-K2.6-kv"
    ckpt.mkdir()
    overlay.mkdir()
    (ckpt / "model-00001.safetensors").write_bytes(b"x")
    (overlay / "model-00001.safetensors").symlink_to("../Kimi-K2.6/model-00001.safetensors")
    (overlay / "config.json").write_text('{"model_type": "deepseek_v3", "kv_lora_rank": 512}')  # a real file
    scales = tmp_path / "scales.json"
    KvScales("mla", (LayerScale(0, 4.0, None, 4.0, 1.0),), 1.25, 10, 1).save(scales)
    env = write_env(
        tmp_path / "o.env",
        f"INCLUDE={CONFIGS / 'production-fp8kv.env'}\nMODEL_DIR={overlay}\nKV_SCALES_FILE={scales}\n",
    )
    config = load_config(env, environ={})
    volumes = container_spec(config, render(config), "img:1")["volumes"]
    assert volumes[str(ckpt)] == {"bind": str(ckpt), "mode": "ro"}
    assert volumes[str(overlay)] == {"bind": str(overlay), "mode": "ro"}
    assert volumes[str(scales)] == {"bind": str(scales), "mode": "ro"}
    plain = load_config(
        write_env(tmp_path / "p.env", f"INCLUDE={CONFIGS / 'production.env'}\nMODEL_DIR={ckpt}\n"), environ={}
    )
    assert set(container_spec(plain, render(plain), "img:1")["volumes"]) == {str(ckpt), "/models/Kimi-K2.5-DFlash"}


def test_a_local_engine_short_of_disk_is_refused_before_building(tmp_path, monkeypatch):
    """CI once ran the CPU base build into ENOSPC minutes in; the engine's data root
    is now measured first (when it is on this machine) and named in the error."""
    import shutil
    from collections import namedtuple

    from kimidflash.docker.engine import require_free_space
    from kimidflash.errors import EngineUnavailable

    class Client:
        def __init__(self, root):
            self.root = root

        def info(self):
            return {"DockerRootDir": self.root}

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(100 * 2**30, 97 * 2**30, 3 * 2**30))
    with pytest.raises(EngineUnavailable, match=rf"8 GiB free in the Docker data root {tmp_path}, which has 3.0 GiB"):
        require_free_space(Client(str(tmp_path)), 8, "building kimidflash-cpu-base")
    require_free_space(Client(str(tmp_path)), 2, "x")  # enough
    require_free_space(Client("/no/such/remote/root"), 8, "x")  # a remote engine: not measured here


def test_a_chat_template_is_rendered_mounted_read_only_and_checked_by_preflight(tmp_path):
    from kimidflash.preflight import check_model_dirs

    template = tmp_path / "t.jinja"
    cfg = write_env(tmp_path / "c.env", f"INCLUDE={CONFIGS / 'production.env'}\nCHAT_TEMPLATE=t.jinja\n")
    config, spec = spec_for(cfg)
    assert config.chat_template == str(template)  # relative to the env file
    assert spec["volumes"][str(template)] == {"bind": str(template), "mode": "ro"}
    argv = render(config).argv
    assert argv[argv.index("--chat-template") + 1] == str(template)
    missing = [c for c in check_model_dirs(config) if c.name == "CHAT_TEMPLATE"]
    assert len(missing) == 1 and not missing[0].ok and "is missing" in missing[0].detail
    template.write_text("{{ messages }}")
    assert all(c.ok for c in check_model_dirs(config) if c.name == "CHAT_TEMPLATE")
    plain, _ = spec_for(write_env(tmp_path / "p.env", f"INCLUDE={CONFIGS / 'production.env'}\n"))
    assert "--chat-template" not in render(plain).argv
    assert not [c for c in check_model_dirs(plain) if c.name == "CHAT_TEMPLATE"]
