"""Slow tier, real Docker engine: build the CPU base and the CPU image from
Dockerfile.kimi26-dflash with build-kimi26-dflash.sh, serve the tiny pair from
the container, and refuse a build whose patch set drifts.

The engine is ensured (docker.io installed and a private dockerd started if
none answers). The CPU base is cached by a content hash, so a second run on
the same machine skips it; the test images are removed at the end, and every
container started here is stopped and removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time

import httpx
import pytest

from kimidflash.config import load_config
from kimidflash.docker import build as build_mod
from kimidflash.docker.cpu_base import ensure_cpu_base
from kimidflash.docker.engine import engine_url, ensure_engine
from kimidflash.docker.run import ContainerServer, prepare_tiny_models, start_server
from kimidflash.docker.spec import MANAGED_LABEL, container_spec
from kimidflash.preshard import manifest as preshard_manifest
from kimidflash.render import render

from ..support.helpers import CONFIGS, ROOT, free_port

pytestmark = pytest.mark.slow
TEST_NAME = "kimidflash-test/kimi26-dflash-cpu"
DRIFT_SET = [
    {
        "id": "D1",
        "group": "drift test",
        "what": "an edit whose anchor no vLLM has",
        "why": "a drifted patch set must stop the image build",
        "upstream": None,
        "variants": [
            {
                "versions": [["0.1.0", "99.0.0"]],
                "file": "v1/spec_decode/dflash.py",
                "edits": [
                    {
                        "anchor": "kimidflash drift test: this text is in no vLLM release\n",
                        "replace": "x = 1  # kimidflash:D1\n",
                    }
                ],
            }
        ],
    }
]


def remove_new_untagged(client, existing: set[str]) -> None:
    """The classic builder keeps the layers of a failed build as cache: drop the ones made here."""
    for _ in range(20):
        new = [i for i in client.images.list(all=True) if i.id not in existing and not i.tags]
        if not new:
            return
        for image in new:
            with contextlib.suppress(Exception):  # a child still holds it: the next round
                client.images.remove(image.id)


@pytest.fixture(scope="module")
def client():
    return ensure_engine()


@pytest.fixture(scope="module")
def cpu_image(client):
    """Built by the user-facing script, exactly as the docs say."""
    env = {**os.environ, "DOCKER_HOST": engine_url(client)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "build-kimi26-dflash.sh"), "configs/cpu-tiny.env", "--name", TEST_NAME],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    print(f"image build (base included when not cached): {time.monotonic() - t0:.0f}s")
    tag = re.search(rf"{re.escape(TEST_NAME)}:0\.32\.0-[0-9a-f]{{12}}", out)
    assert tag, out[-2000:]
    yield tag.group(0), out
    for ref in (tag.group(0), f"{TEST_NAME}:latest"):
        with contextlib.suppress(Exception):
            client.images.remove(ref)


def test_image_carries_labels_and_the_patch_report(client, cpu_image):
    tag, out = cpu_image
    expected_hash = build_mod.host_patchset_hash(ROOT, None)
    labels = client.images.get(tag).labels
    assert labels[build_mod.LABEL_VLLM] == "0.32.0"
    assert labels[build_mod.LABEL_PATCHSET] == expected_hash == tag.rsplit("-", 1)[1]
    report = build_mod.read_report(client, tag)
    assert report["vllm_version"].startswith("0.32.0") and report["patchset_hash"] == expected_hash
    assert report["exit_code"] == 0 and report["errors"] == []
    assert not any(p["state"] == "drift" for p in report["patches"])
    assert '"patchset_hash"' in out  # the build command printed the report
    # The CPU base's CA bundle stayed in its throwaway stage.
    history = " ".join(str(h.get("CreatedBy", "")) for h in client.images.get(tag).history())
    assert "build-ca.pem" not in history


def test_serves_the_tiny_pair_from_the_container(client, cpu_image):
    tag, _ = cpu_image
    config = load_config(CONFIGS / "cpu-tiny.env", {"PORT": str(free_port()), "RUNTIME": "docker"}, environ={})
    prepare_tiny_models(client, config, tag)
    rendered = render(config)
    lines: list[str] = []
    server = start_server(config, rendered, image=tag, client=client, echo=lines.append)
    try:
        attrs = client.api.inspect_container(server.name)
        assert attrs["HostConfig"]["Init"] is True and attrs["HostConfig"]["Privileged"] is False
        assert all(m["RW"] is False for m in attrs["Mounts"])
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, "container died:\n" + "\n".join(server.tail)
            try:
                if httpx.get(f"{config.base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "not healthy in 300s:\n" + "\n".join(server.tail)
            time.sleep(1)
        print(f"container healthy; launcher said: {[x for x in lines if 'kimi26-vllm-dflash' in x][:2]}")
        reply = httpx.post(
            f"{config.base_url}/v1/chat/completions",
            timeout=120,
            json={
                "model": config.served_model_name,
                "messages": [{"role": "user", "content": "the model reads"}],
                "max_tokens": 24,
                "temperature": 0,
            },
        ).json()
        assert reply["usage"]["completion_tokens"] > 0, reply
        assert isinstance(reply["choices"][0]["message"]["content"], str)
        # Spec-decode counters, read from inside the container.
        rc, metrics = server.container.exec_run(
            [
                "python3",
                "-c",
                f"import urllib.request; print(urllib.request.urlopen('{config.base_url}/metrics').read().decode())",
            ]
        )
        assert rc == 0
        counters = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r"^vllm:spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens)_total\{[^}]*\} (\S+)$",
                metrics.decode(),
                re.M,
            )
        }
        assert counters["num_drafts"] > 0 and counters["num_draft_tokens"] == 3 * counters["num_drafts"], counters
        assert "num_accepted_tokens" in counters
        # Docker's own HEALTHCHECK (interval 30s) agrees once it has run.
        health_deadline = time.monotonic() + 75
        while client.api.inspect_container(server.name)["State"]["Health"]["Status"] != "healthy":
            assert time.monotonic() < health_deadline, client.api.inspect_container(server.name)["State"]["Health"]
            time.sleep(3)
    finally:
        code = server.stop()
    assert code in (0, 143), "\n".join(server.tail)  # SIGTERM through tini: a clean exit
    assert client.containers.list(all=True, filters={"name": server.name}) == []


def test_a_dying_container_is_reported_and_removed(client, cpu_image):
    tag, _ = cpu_image
    config = load_config(CONFIGS / "cpu-tiny.env", {"PORT": str(free_port())}, environ={})
    spec = container_spec(config, render(config), tag)
    spec["command"] = ["--", "python3", "-c", "import sys; print('engine exploded'); sys.exit(7)"]
    server = ContainerServer(client, spec)
    deadline = time.monotonic() + 60
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server.poll() == 7
    assert server.stop() == 7
    assert any("engine exploded" in line for line in server.tail)
    assert client.containers.list(all=True, filters={"label": MANAGED_LABEL}) == []


def test_drifted_patch_set_fails_the_build_with_the_patchers_message(client, cpu_image, tmp_path):
    tag, _ = cpu_image
    drift = tmp_path / "drift-test.json"
    drift.write_text(json.dumps(DRIFT_SET))
    base = ensure_cpu_base(client, "0.32.0", log=print)  # cached by the image build above
    before = {i.id for i in client.images.list(name=TEST_NAME + "-drift")}
    existing = {i.id for i in client.images.list(all=True)}
    try:
        with pytest.raises(build_mod.BuildFailed) as err:
            build_mod.build_image(
                client, base_image=base, vllm_version="0.32.0", name=TEST_NAME + "-drift", patch_set=drift
            )
    finally:
        remove_new_untagged(client, existing)
    msg = str(err.value)
    assert "patch_dflash_rocm: drift: D1 v1/spec_decode/dflash.py: anchor not found" in msg, msg
    assert {i.id for i in client.images.list(name=TEST_NAME + "-drift")} == before == set()


def test_ca_bundle_goes_through_buildkit_as_a_secret(client, cpu_image, tmp_path):
    """--ca-bundle: BuildKit via the docker CLI; the bundle reaches RUN as a secret, in no layer."""
    if build_mod._buildkit_cli() is None:
        pytest.skip("no docker CLI with BuildKit here (buildx, or a pre-23 client)")
    base = ensure_cpu_base(client, "0.32.0", log=print)
    ca = tmp_path / "proxy-ca.pem"
    with open("/etc/ssl/certs/ca-certificates.crt", "rb") as system_ca:
        ca.write_bytes(system_ca.read())
    existing = {i.id for i in client.images.list(all=True)}
    result = build_mod.build_image(client, base_image=base, vllm_version="0.32.0", name=TEST_NAME + "-bk", ca_bundle=ca)
    try:
        image = client.images.get(result.tags[0])
        assert image.labels[build_mod.LABEL_PATCHSET] == result.report["patchset_hash"]
        history = " ".join(str(h.get("CreatedBy", "")) for h in image.history())
        assert "# buildkit" in history and "/run/secrets/ca" in history and "proxy-ca.pem" not in history
        import docker

        with pytest.raises(docker.errors.ContainerError, match="No such file"):
            client.containers.run(result.tags[0], entrypoint=["ls", "/run/secrets/ca"], remove=True)
    finally:
        for t in result.tags:
            client.images.remove(t)
        remove_new_untagged(client, existing)


def test_serve_sh_runs_the_container_runtime(client, cpu_image):
    """The user-facing path: ./serve.sh configs/cpu-tiny.env with RUNTIME=docker, stopped by SIGTERM."""
    from ..conftest import serving

    image_name = cpu_image[0].split(":")[0]
    os.environ["DOCKER_HOST"] = engine_url(client)
    with serving(
        CONFIGS / "cpu-tiny.env", "RUNTIME=docker", f"IMAGE_NAME={image_name}", cmd=[str(ROOT / "serve.sh")]
    ) as server:
        reply = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            timeout=120,
            json={
                "model": "tiny-qwen3-dflash",
                "messages": [{"role": "user", "content": "the model reads"}],
                "max_tokens": 16,
                "temperature": 0,
            },
        ).json()
        assert reply["usage"]["completion_tokens"] > 0, reply
        assert server.metrics()["vllm:spec_decode_num_drafts_total"] > 0
        names = [c.name for c in client.containers.list(filters={"label": MANAGED_LABEL})]
        assert any(server.base_url.rsplit(":", 1)[1] in n for n in names), names
        server.proc.send_signal(15)
        assert server.proc.wait(timeout=120) == 0
    assert [
        c.name
        for c in client.containers.list(all=True, filters={"label": MANAGED_LABEL})
        if server.base_url.rsplit(":", 1)[1] in c.name
    ] == []


def test_preshard_runs_inside_the_image_and_serve_loads_the_shards(client, cpu_image, tmp_path):
    """The playbook's pre-shard step where vLLM lives only in the image: the payload
    script run in the container, then serve.sh (RUNTIME=docker) from the shards."""
    from ..conftest import serving

    tag = cpu_image[0]
    config = load_config(CONFIGS / "cpu-tiny.env", {"RUNTIME": "docker"}, environ={})
    prepare_tiny_models(client, config, tag)
    out = tmp_path / "shards"
    out.mkdir()
    client.containers.run(
        tag,
        entrypoint=["python3", "payload/preshard_kimi26.py"],
        command=[
            "configs/cpu-tiny.env",
            "--set",
            "MODEL_DIR=/models/target",
            "--set",
            "VLLM_VENV=",
            "--set",
            "PREPARE_MODELS=none",
            "--set",
            "SPECULATIVE_METHOD=none",
            "--out",
            "/out/tiny-tp1",
        ],
        volumes={
            config.model_dir: {"bind": "/models/target", "mode": "ro"},
            str(out): {"bind": "/out", "mode": "rw"},
        },
        remove=True,
        network_mode="none",
        ipc_mode="host",
    )
    shards = out / "tiny-tp1"
    doc = preshard_manifest.read(shards)
    assert (doc["tensor_parallel_size"], doc["vllm_version"]) == (1, "0.32.0")  # the image's vLLM reported it
    assert preshard_manifest.problems(shards, tensor_parallel_size=1, vllm_version="0.32.0", hashes=True) == []

    os.environ["DOCKER_HOST"] = engine_url(client)
    with serving(
        CONFIGS / "cpu-tiny.env",
        "RUNTIME=docker",
        f"IMAGE_NAME={tag.split(':')[0]}",
        "SPECULATIVE_METHOD=none",
        f"PRESHARDED_DIR={shards}",
        cmd=[str(ROOT / "serve.sh")],
    ) as server:
        reply = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            timeout=120,
            json={
                "model": "tiny-qwen3-dflash",
                "messages": [{"role": "user", "content": "the model reads"}],
                "max_tokens": 8,
                "temperature": 0,
            },
        ).json()
        assert reply["usage"]["completion_tokens"] > 0, reply
        assert "sharded_state_loader" in server.log.read_text()
