"""Run the recipe image as a server container and supervise it.

`ContainerServer` has the same small surface as serve.py's LocalServer
(`tail`, `poll()`, `stop()`), so serve.sh's health wait, ready line, signal
handling and death report work unchanged for RUNTIME=docker. The container
always runs with `init=True`: tini as PID 1 forwards SIGTERM to the launcher
(Python as PID 1 ignores it, and `docker stop` would wait its full timeout).
`stop()` stops and removes the container, so nothing is left behind; a
container that died keeps its last log lines in `tail` for the report.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ..config import Config
from ..cpu_reference.generated import PREPARE_KIND, pair_is_current
from ..errors import ContainerError
from ..fsio import sibling_lock
from ..logtail import STOP_GRACE_S, Log, LogTail
from ..render import Rendered
from .build import LABEL_VLLM
from .engine import Client, find_client, require_client
from .spec import MANAGED_LABEL, container_spec, docker_run_line


def resolve_image(client: Client, config: Config) -> str:
    """The newest IMAGE_NAME image built for the config's vLLM pin (by its label)."""
    pin, name = config.vllm_version, config.image_name
    images = client.images.list(name=name, filters={"label": f"{LABEL_VLLM}={pin}"})
    if not images:
        where = config.path or "the config"
        raise ContainerError(f"no {name} image built for vLLM {pin}: run ./build-kimi26-dflash.sh {where}")
    newest = max(images, key=lambda im: im.attrs.get("Created", ""))
    versioned = [t for t in newest.tags if not t.endswith(":latest")]
    return (versioned or newest.tags or [newest.id])[0]


def dry_run_line(config: Config, rendered: Rendered, image: str | None = None) -> str:
    """The `docker run` serve.sh would execute (image: the resolved one, else NAME:latest)."""
    if image is None:
        client = find_client(timeout=10)
        try:
            image = resolve_image(client, config) if client is not None else f"{config.image_name}:latest"
        except ContainerError:
            image = f"{config.image_name}:latest"
    return docker_run_line(container_spec(config, rendered, image))


class ContainerServer:
    """A started server container, its log pumped to `log`/`echo` and kept in `tail`."""

    def __init__(
        self,
        client: Client,
        spec: dict[str, Any],
        log: TextIO | None = None,
        echo: Log = lambda line: None,
    ) -> None:
        import docker

        self.client = client
        self.spec = dict(spec)
        self.name: str = spec["name"]
        self._sink = LogTail(log, echo)
        self.tail = self._sink.lines
        self._exit: int | None = None
        self._removed = False
        self._clear_stale(docker)
        if self.spec.get("privileged"):
            raise ContainerError("refusing a privileged container spec")
        kwargs = {k: v for k, v in self.spec.items() if k != "image"}
        try:
            self.container = client.containers.run(self.spec["image"], detach=True, **kwargs)
        except docker.errors.ImageNotFound:
            raise ContainerError(
                f"image {self.spec['image']} is not on this engine: run ./build-kimi26-dflash.sh"
            ) from None
        except docker.errors.APIError as e:
            raise ContainerError(f"docker could not start {self.name}: {e.explanation or e}") from None
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _clear_stale(self, docker: Any) -> None:  # the SDK's module, for its NotFound
        """A dead container of ours with this name (a crash, a killed serve.sh) is removed; a live one is an error."""
        try:
            old = self.client.containers.get(self.name)
        except docker.errors.NotFound:
            return
        if old.status == "running":
            raise ContainerError(f"container {self.name} is already running: `docker stop {self.name}` or change PORT")
        if old.labels.get(MANAGED_LABEL) != "1":
            raise ContainerError(f"a container named {self.name} exists and is not ours: remove or rename it")
        old.remove(force=True)

    def _read(self) -> None:
        buf = b""
        for chunk in self.container.logs(stream=True, follow=True):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                self._sink(raw.decode(errors="replace").rstrip("\r"))
        if buf:
            self._sink(buf.decode(errors="replace"))

    def poll(self) -> int | None:
        """The exit code once the container has stopped, else None."""
        if self._exit is not None:
            return self._exit
        try:
            self.container.reload()
        except Exception:  # removed underneath us: treat as dead
            self._exit = -1
            return self._exit
        if self.container.status in ("exited", "dead"):
            self._exit = int(self.container.attrs["State"]["ExitCode"])
        return self._exit

    def stop(self, grace: float = STOP_GRACE_S, settle: float = 120.0) -> int:
        """docker stop (SIGTERM through tini, SIGKILL after `grace`), then remove. Returns the exit code.

        An engine can refuse a stop (dockerd: "tried to kill container, but did not receive an exit
        event") while a process of the container is still being torn down by the kernel; the container
        then exits later. Waiting up to `settle` more seconds for that, then removing it, leaves no
        container behind to block the next start under the same name."""
        if not self._removed:
            try:
                self.container.stop(timeout=int(grace))
                code = int(self.container.wait(timeout=grace + 30).get("StatusCode", -1))
                deadline = time.monotonic() + settle
            except Exception:
                deadline = time.monotonic() + settle  # one budget for the exit and the removal
                code = self._settled(deadline)
            self._exit = code if self._exit is None else self._exit
            self._pump.join(timeout=5)
            self._remove(deadline)
            self._removed = True
        return self._exit if self._exit is not None else -1

    def _settled(self, deadline: float) -> int:
        """The exit code once a container that refused a stop has exited (-1 if it has not by `deadline`)."""
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the engine may refuse the kill again; it is retried
                self.container.kill()
            polled = self.poll()
            if polled is not None:
                return polled
            time.sleep(2)
        return -1

    def _remove(self, deadline: float) -> None:
        import docker

        while True:
            try:
                self.container.remove(force=True)
                return
            except docker.errors.NotFound:  # already gone
                return
            except Exception:
                if time.monotonic() >= deadline:
                    return  # the next start's _clear_stale removes it once it has exited
                time.sleep(2)

    def __enter__(self) -> ContainerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def prepare_tiny_models(client: Client, config: Config, image: str, log: Log = lambda m: None) -> None:
    """PREPARE_MODELS=tiny or tiny-kimi with RUNTIME=docker: generate the pair with the image's
    own torch (the host needs no vLLM venv), into the host dirs the server then mounts."""
    target, draft = Path(config.model_dir), Path(config.draft_model_dir)
    prepare = config.prepare_models
    if pair_is_current(prepare, target, draft):
        return
    parents = sorted({str(target.parent), str(draft.parent)})
    for p in parents:
        Path(p).mkdir(parents=True, exist_ok=True)
    with sibling_lock(target):  # the same lock as serve's own prepare step: the pair is made once
        if pair_is_current(prepare, target, draft):
            return
        log(f"generating the tiny reference pair in {', '.join(parents)} inside {image} (once)")
        out = client.containers.run(
            image,
            entrypoint=["python3", "-m", "kimidflash", "tiny-model"],
            command=["--kind", PREPARE_KIND[prepare], str(target), str(draft)],
            volumes={p: {"bind": p, "mode": "rw"} for p in parents},
            network_mode="none",
            remove=True,
            stdout=True,
            stderr=True,
            labels={MANAGED_LABEL: "1"},
        )
    if not pair_is_current(prepare, target, draft):
        raise ContainerError(f"generating the tiny models in {image} left them incomplete: {out[-300:]!r}")


def start_server(
    config: Config,
    rendered: Rendered,
    *,
    image: str | None = None,
    log: TextIO | None = None,
    echo: Log = lambda line: None,
    client: Client | None = None,
) -> ContainerServer:
    """serve.sh RUNTIME=docker: resolve the image, build the spec, start the container."""
    client = client or require_client()
    image = image or resolve_image(client, config)
    return ContainerServer(client, container_spec(config, rendered, image), log, echo)
