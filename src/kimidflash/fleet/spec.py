"""The fleet file (TOML): replicas, each a recipe config (started here) or a URL
(only checked), and the vllm-router in front of them.

    [router]
    policy = "consistent_hash"     # vllm-router --policy
    host = "127.0.0.1"
    port = 8000
    prometheus_port = 29000

    [[replica]]
    name = "a"
    config = "../configs/cpu-tiny.env"   # relative to the fleet file
    port = 8101
    set = ["MAX_NUM_SEQS=8"]             # like serve --set

    [[replica]]
    name = "node2"
    url = "http://10.0.0.2:8000"

Everything that would make a fleet wrong rather than slow is refused before
anything starts, with the file and the field named: two local listeners on one
port, replicas serving different model names, vLLM pins or drafters (a fleet
must answer the same whichever replica a request lands on), and a router
reachable beyond loopback while the replicas take no API key (vllm-router
passes the client's Authorization header through and checks none itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends import DRAFT_MODEL_METHODS
from ..config import ConfigError, load_config
from ..config.model import Config
from ..errors import FleetError
from ..fsio import read_toml_tables
from ..settings import LOOPBACK_HOSTS

POLICIES = ("round_robin", "random", "cache_aware", "consistent_hash", "power_of_two", "sticky_least_loaded")
ROUTER_KEYS = {"policy", "host", "port", "prometheus_port", "health_check_interval_secs", "log_level", "version"}
REPLICA_KEYS = {"name", "config", "port", "set", "url"}
# The fields replicas must agree on (what a request's answer depends on), from each config.
AGREE = (
    "SERVED_MODEL_NAME",
    "VLLM_VERSION",
    "SPECULATIVE_METHOD",
    "DRAFT_MODEL_DIR",
    "NUM_SPECULATIVE_TOKENS",
    "DTYPE",
)


@dataclass(frozen=True)
class Router:
    policy: str = "consistent_hash"
    host: str = "127.0.0.1"
    port: int = 8000
    prometheus_port: int = 29000
    health_check_interval_secs: int = 5
    log_level: str = "warning"  # consistent_hash logs several lines per request at info
    version: str = "0.1.17"


@dataclass(frozen=True)
class Replica:
    name: str
    config: Config | None = None  # local: started through the recipe's serve path
    url: str | None = None  # remote: only checked
    config_path: Path | None = None  # local: the env file and the overrides it is served with (PORT apart)
    overrides: tuple[str, ...] = ()

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1") if self.url else self.served.base_url

    @property
    def local(self) -> bool:
        return self.config is not None

    @property
    def served(self) -> Config:
        """A local replica's config (the fleet's checks ask it of local replicas only)."""
        assert self.config is not None, f"{self.name} is a remote replica: it has no config"
        return self.config


@dataclass(frozen=True)
class Fleet:
    path: Path
    router: Router
    replicas: list[Replica] = field(default_factory=list)

    @property
    def local(self) -> list[Replica]:
        return [r for r in self.replicas if r.local]


def _int(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise FleetError(f"{where}: {key} must be a port number (1-65535), got {value!r}")
    return value


def _router(path: Path, data: dict[str, Any]) -> Router:
    where = f"{path} [router]"
    unknown = set(data) - ROUTER_KEYS
    if unknown:
        raise FleetError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(ROUTER_KEYS))}"
        )
    r = Router(**data)
    if r.policy not in POLICIES:
        raise FleetError(f"{where}: policy {r.policy!r} is not one of {', '.join(POLICIES)}")
    _int(where, "port", r.port)
    _int(where, "prometheus_port", r.prometheus_port)
    return r


def _replica(path: Path, i: int, data: dict[str, Any], environ: dict[str, str] | None) -> Replica:
    where = f"{path} [[replica]] #{i + 1}"
    unknown = set(data) - REPLICA_KEYS
    if unknown:
        raise FleetError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(REPLICA_KEYS))}"
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise FleetError(f"{where}: name is required")
    where = f"{path} replica {name!r}"
    if ("config" in data) == ("url" in data):
        raise FleetError(
            f"{where}: give exactly one of config (a replica started here) and url (one running elsewhere)"
        )
    if "url" in data:
        if not str(data["url"]).startswith(("http://", "https://")):
            raise FleetError(f"{where}: url {data['url']!r} is not an http(s) URL")
        if "port" in data or "set" in data:
            raise FleetError(f"{where}: port and set apply to a local replica (config), not to url")
        return Replica(name, url=str(data["url"]))
    sets = data.get("set", [])
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise FleetError(f'{where}: set must be a list of "KEY=VALUE" strings')
    port = _int(where, "port", data.get("port"))
    config_path = (path.parent / Path(str(data["config"])).expanduser()).resolve()
    try:
        cfg = load_config(config_path, [*sets, f"PORT={port}"], environ=environ)
    except (ConfigError, OSError) as exc:
        raise FleetError(f"{where}: {exc}") from None
    return Replica(name, config=cfg, config_path=config_path, overrides=tuple(sets))


def load_fleet(path: str | Path, environ: dict[str, str] | None = None) -> Fleet:
    """Read and validate a fleet file; `environ` as for load_config (API_KEY comes from it)."""
    path = Path(path).resolve()
    data = read_toml_tables(path, "fleet file", ("[router]", "[[replica]]"), FleetError)
    replicas = [_replica(path, i, r, environ) for i, r in enumerate(data.get("replica") or [])]
    if not replicas:
        raise FleetError(f"{path}: no [[replica]]; a fleet needs at least one")
    fleet = Fleet(path, _router(path, data.get("router") or {}), replicas)
    check_fleet(fleet)
    return fleet


def check_fleet(fleet: Fleet) -> None:
    """The rules across replicas and the router (each refusal names the field)."""
    path = fleet.path
    names = [r.name for r in fleet.replicas]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise FleetError(f"{path}: replica name {dup[0]!r} is used twice")
    ports: dict[int, str] = {
        fleet.router.port: "[router] port",
        fleet.router.prometheus_port: "[router] prometheus_port",
    }
    if fleet.router.port == fleet.router.prometheus_port:
        raise FleetError(f"{path}: [router] port and prometheus_port are both {fleet.router.port}")
    for r in fleet.local:
        port = r.served.port
        if port in ports:
            raise FleetError(f"{path}: replica {r.name!r} port {port} is already taken by {ports[port]}")
        ports[port] = f"replica {r.name!r} port"
    for r in fleet.local[1:]:
        first = fleet.local[0]
        for key in AGREE:
            a, b = first.served.value(key), r.served.value(key)
            if key == "DRAFT_MODEL_DIR" and first.served.speculative_method not in DRAFT_MODEL_METHODS:
                continue
            if a != b:
                raise FleetError(
                    f"{path}: replica {r.name!r} {key}={b} but replica {first.name!r} has {a}; "
                    "every replica must answer alike"
                )
    if fleet.router.host not in LOOPBACK_HOSTS:
        keyless = [r.name for r in fleet.local if not r.served.api_key]
        if keyless:
            raise FleetError(
                f"{path}: [router] host {fleet.router.host} exposes the fleet, and vllm-router checks no "
                f"key itself: replica(s) {', '.join(keyless)} take none; export API_KEY=... so every "
                "replica requires it (clients send it through the router), or keep host=127.0.0.1"
            )
