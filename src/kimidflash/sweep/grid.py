"""The sweep's grid: server points and client cases, expanded and checked up front.

A grid is a set of server keys (any env-file key, each with one or more
values) and client settings (concurrency, sessions, turns, max tokens, prompt
set), from options or a small TOML file::

    [server]
    NUM_SPECULATIVE_TOKENS = [1, 2, 3, 5, 7]
    [client]
    concurrency = [1, 4, 8]
    max_tokens = 64
    [[point]]   # a server point beyond the product (repeatable): one value per key
    NUM_SPECULATIVE_TOKENS = 3
    NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE = "1-1:3,2-8:0"

Its Cartesian product, then the ``[[point]]`` tables, give the server points, each a
set of ``--set`` overrides on the base config. A point of its own is how a draft
schedule is measured beside the static k it must beat: a schedule is valid only
with the k it was written for, so it cannot join the product. Every point is
loaded and rendered by the same schema `serve` uses before anything starts, so a
bad point refuses the whole sweep with its name; points that render the same
server are run once; and a no-speculation baseline is added for every
combination of the non-speculative keys, so every speedup is a ratio within the run.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..bench.workloads import WORKLOADS
from ..config import FIELDS, ConfigError, load_config
from ..errors import SweepError
from ..fsio import read_toml_tables
from ..paths import portable
from ..render import render

SPECULATIVE_KEYS = frozenset(f.name for f in FIELDS if f.group == "speculative")
# Keys a point may not vary: the sweep owns where each server listens.
FIXED_KEYS = frozenset({"PORT", "INCLUDE"})
SHORT = {
    "NUM_SPECULATIVE_TOKENS": "k",
    "SPECULATIVE_METHOD": "spec",
    "MAX_NUM_SEQS": "seqs",
    "KV_CACHE_DTYPE": "kv",
    "MAX_NUM_BATCHED_TOKENS": "batched",
    "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": "sched",
}
CLIENT_KEYS = {"concurrency": int, "sessions": int, "turns": int, "max_tokens": int, "prompts": str, "workload": str}
CLIENT_DEFAULTS: dict[str, list[Any]] = {
    "concurrency": [1, 8],
    "sessions": [16],
    "turns": [1],
    "max_tokens": [128],
    "prompts": ["builtin"],
    "workload": ["free"],
}
CASE_SHORT = {"concurrency": "c", "sessions": "s", "turns": "t", "max_tokens": "m", "prompts": "p", "workload": "w"}


@dataclass(frozen=True)
class Point:
    """One server: the overrides on the base config, and what it is compared with."""

    id: str
    overrides: tuple[tuple[str, str], ...]
    baseline_id: str  # the no-speculation point with the same non-speculative keys (itself for a baseline)
    speculative: bool
    k: int | None  # NUM_SPECULATIVE_TOKENS when speculative
    family: str | None  # speculative points that differ only in k share a family (the advisor's unit)

    @property
    def is_baseline(self) -> bool:
        return self.id == self.baseline_id

    @property
    def sets(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.overrides]

    @property
    def label(self) -> str:
        return "no speculation" + _suffix(self.overrides) if self.is_baseline else " ".join(self.sets)


@dataclass(frozen=True)
class Case:
    """One client setting: how the benchmark drives a point."""

    id: str
    concurrency: int
    sessions: int
    turns: int
    max_tokens: int
    prompts: str
    workload: str = "free"  # bench/workloads.py


@dataclass
class Grid:
    server: dict[str, list[str]] = field(default_factory=dict)
    client: dict[str, list[Any]] = field(default_factory=dict)
    extra: list[dict[str, str]] = field(default_factory=list)  # [[point]] tables

    def as_dict(self) -> dict[str, Any]:
        """As manifests record it: prompt files by their portable path."""
        client = {**CLIENT_DEFAULTS, **self.client}
        client["prompts"] = [portable(p) for p in client["prompts"]]
        if client["workload"] == ["free"]:
            del client["workload"]  # as folders written before workloads recorded it
        return {"server": self.server, "client": client, **({"points": self.extra} if self.extra else {})}


def _suffix(overrides: tuple[tuple[str, str], ...]) -> str:
    rest = [f"{k}={v}" for k, v in overrides if k not in SPECULATIVE_KEYS]
    return f" ({' '.join(rest)})" if rest else ""


def _slug(text: str) -> str:
    """A value as part of a folder name; an empty value (the key unset) is "-off"."""
    if not text:
        return "-off"
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-").lower() or "x"


def _values(key: str, raw: Any, where: str) -> list[Any]:
    vals = raw if isinstance(raw, list) else [raw]
    if not vals:
        raise SweepError(f"{where}: {key} has no values")
    if any(isinstance(v, (dict, list)) for v in vals):
        raise SweepError(f"{where}: {key} must be a value or a list of values")
    if len(set(map(str, vals))) != len(vals):
        raise SweepError(f"{where}: {key} repeats a value ({', '.join(map(str, vals))})")
    return vals


def _server_values(key: str, values: Any, where: str) -> list[str]:
    if key in FIXED_KEYS:
        raise SweepError(f"{where}: {key} cannot be swept (the sweep picks each server's port and base config)")
    return [str(v).lower() if isinstance(v, bool) else str(v) for v in _values(key, values, where)]


def add_server(grid: Grid, key: str, values: list[Any], where: str) -> None:
    grid.server[key] = _server_values(key, values, where)


def add_point(grid: Grid, table: Any, where: str) -> None:
    """One [[point]] table: a key and one value each."""
    if not isinstance(table, dict) or not table:
        raise SweepError(f"{where}: a [[point]] table holds keys, one value each")
    point = {}
    for key, value in table.items():
        if isinstance(value, list):
            raise SweepError(
                f"{where}: {key} has a list; a [[point]] takes one value per key (put lists under [server])"
            )
        point[key] = _server_values(key, value, where)[0]
    grid.extra.append(point)


def add_client(grid: Grid, key: str, values: list[Any], where: str, base_dir: Path = Path(".")) -> None:
    """Add a client setting; a prompt file is resolved from `base_dir` (a grid
    file's folder, or the working directory) and must exist."""
    if key not in CLIENT_KEYS:
        raise SweepError(f"{where}: unknown client setting {key!r}; known: {', '.join(CLIENT_KEYS)}")
    kind = CLIENT_KEYS[key]
    out = []
    for v in _values(key, values, where):
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) and not str(v).isdigit()):
            raise SweepError(f"{where}: {key} value {v!r} is not a whole number")
        v = kind(v)
        if kind is int and v < 1:
            raise SweepError(f"{where}: {key} must be at least 1, got {v}")
        if key == "workload" and v not in WORKLOADS:
            raise SweepError(f"{where}: workload {v!r} is not one of {', '.join(WORKLOADS)}")
        if key == "prompts" and v != "builtin":
            path = (base_dir / Path(v).expanduser()).resolve()
            if not path.is_file():
                raise SweepError(f"{where}: prompt file {path} does not exist")
            v = str(path)
        out.append(v)
    grid.client[key] = out


def read_grid_file(path: Path) -> Grid:
    data = read_toml_tables(path, "grid file", ("[server]", "[client]", "[[point]]"), SweepError)
    grid = Grid()
    for key, vals in (data.get("server") or {}).items():
        add_server(grid, key, vals, f"grid file {path} [server]")
    tables = data.get("point") or []
    for i, table in enumerate(tables if isinstance(tables, list) else [tables], 1):
        add_point(grid, table, f"grid file {path} [[point]] {i}")
    for key, vals in (data.get("client") or {}).items():
        add_client(grid, key, vals, f"grid file {path} [client]", path.parent)
    return grid


def cases(grid: Grid) -> list[Case]:
    """The client grid's product, named by what varies (``c4``, or ``c4-m64`` ...)."""
    client = {**CLIENT_DEFAULTS, **grid.client}
    keys = list(CLIENT_KEYS)
    varying = [k for k in keys if len(client[k]) > 1] or ["concurrency"]
    out = []
    for combo in itertools.product(*(client[k] for k in keys)):
        c = dict(zip(keys, combo, strict=False))
        if c["concurrency"] > c["sessions"]:
            raise SweepError(
                f"client case concurrency={c['concurrency']} sessions={c['sessions']}: "
                "more slots than sessions could never be filled; raise sessions"
            )
        ident = "-".join(f"{CASE_SHORT[k]}{_slug(Path(str(c[k])).stem) if k == 'prompts' else c[k]}" for k in varying)
        out.append(Case(ident, **c))
    return out


def _point_id(overrides: tuple[tuple[str, str], ...], baseline: bool) -> str:
    parts = ["none"] if baseline else []
    parts += [f"{SHORT.get(k, k.lower())}{_slug(v)}" for k, v in overrides if not (baseline and k in SPECULATIVE_KEYS)]
    return "_".join(parts) or "base"


def points(grid: Grid, base_config: Path) -> list[Point]:
    """Every server point, validated and rendered, in run order: per combination of
    the non-speculative keys, its baseline first, then each family's largest k
    (the advisor predicts from it), then the rest."""
    keys = list(grid.server)
    combos = [tuple(zip(keys, vals, strict=False)) for vals in itertools.product(*(grid.server[k] for k in keys))]
    combos += [tuple(extra.items()) for extra in grid.extra]
    seen: dict[tuple, str] = {}
    out: list[Point] = []

    def add(overrides: tuple[tuple[str, str], ...], baseline_id: str | None) -> str:
        pid = _point_id(overrides, baseline_id is None)
        try:
            cfg = load_config(base_config, {**dict(overrides), "PORT": "8262"})
            r = render(cfg)
        except ConfigError as e:
            raise SweepError(
                f"point {pid} ({' '.join(f'{k}={v}' for k, v in overrides) or 'the base config'}) is invalid: {e}"
            ) from None
        ident = (tuple(r.argv), tuple(sorted(r.env.items())))
        if ident in seen:
            return seen[ident]
        while pid in seen.values():  # two values that slug alike (a/x, a-x): keep the folders apart
            pid += "+"
        seen[ident] = pid
        k = cfg.num_speculative_tokens if cfg.speculative else None
        family = None
        if cfg.speculative:  # the method and every key but k
            rest = tuple(kv for kv in overrides if kv[0] not in ("NUM_SPECULATIVE_TOKENS", "SPECULATIVE_METHOD"))
            family = "_".join([cfg.speculative_method, *([_point_id(rest, False)] if rest else [])])
        out.append(Point(pid, overrides, baseline_id or pid, cfg.speculative, k, family))
        return pid

    for rest in dict.fromkeys(tuple(kv for kv in c if kv[0] not in SPECULATIVE_KEYS) for c in combos):
        base_id = add((*rest, ("SPECULATIVE_METHOD", "none")), None)
        mine = [c for c in combos if tuple(kv for kv in c if kv[0] not in SPECULATIVE_KEYS) == rest]
        for c in mine:
            add(c, base_id)
    return _largest_k_first(out)


def _largest_k_first(pts: list[Point]) -> list[Point]:
    """Within each baseline's group: the baseline, each family's largest k, then the others by k."""
    ordered: list[Point] = []
    for base in [p for p in pts if p.is_baseline]:
        group = [p for p in pts if p.baseline_id == base.id and not p.is_baseline]
        firsts = [ps[-1] for ps in families(group).values()]
        rest = sorted((p for p in group if p not in firsts), key=lambda p: (p.family or "", p.k or 0))
        ordered += [base, *firsts, *rest]
    return ordered


def families(pts: list[Point]) -> dict[str, list[Point]]:
    """Speculative points that differ only in k, by family, each sorted by k."""
    fams: dict[str, list[Point]] = {}
    for p in pts:
        if p.family is not None:
            fams.setdefault(p.family, []).append(p)
    return {f: sorted(ps, key=lambda p: p.k or 0) for f, ps in fams.items()}


@dataclass
class BenchOptions:
    """Client settings that every case shares (the grid's cases vary the rest)."""

    warmup: int = 2
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = False
    timeout: float = 600.0


@dataclass
class Plan:
    base_config: Path
    points: list[Point]
    cases: list[Case]
    repeats: int
    bench: BenchOptions = field(default_factory=BenchOptions)
    start_timeout: float = 3600.0
