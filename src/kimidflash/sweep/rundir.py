"""The sweep's run folder: what survives a crash, a Ctrl-C or a dead server.

    OUT/manifest.json          what the sweep is (grid, base config and its hash,
                               points, cases), versions, machine, command
    OUT/events.jsonl           one line per thing that happened, appended and synced
    OUT/points/ID/CASE-rN.json one benchmark result per point, case and repeat (atomic)
    OUT/points/ID/server.log   the server's log, appended across attempts
    OUT/points/ID/failure.json the point's last failure: error and last log lines
    OUT/advice/FAMILY-CASE.json the advisor's prediction, made before the family's other k ran
    OUT/summary.{json,md}, OUT/charts/, OUT/best.env

A result file exists only whole, so "done" is "the file is there": re-running
the same command skips it. A run folder answers to one grid and one base
config; another is refused unless ``--new``, which moves the old contents to
``superseded-<time>/`` (nothing is deleted).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import SweepError
from ..fsio import read_json_object, utc_now, write_json_atomic
from .grid import Case, Point

MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
SCHEMA = "kimidflash-sweep/1"


class RunFolder:
    def __init__(self, root: Path):
        self.root = root

    # --- identity ---------------------------------------------------------------------------

    def open(self, identity: dict[str, Any], context: dict[str, Any], *, new: bool) -> bool:
        """Make or reopen the folder for this sweep; True when resuming. A folder
        made for another identity is refused unless `new` (then superseded)."""
        path = self.root / MANIFEST
        if path.is_file():
            try:
                old = read_json_object(path, MANIFEST)
            except ValueError as e:
                raise SweepError(f"{e}; move the folder aside or pass --new") from None
            if old.get("identity") == identity:
                return True
            if not new:
                changed = sorted(
                    k
                    for k in set(identity) | set(old.get("identity", {}))
                    if identity.get(k) != old.get("identity", {}).get(k)
                )
                raise SweepError(
                    f"{self.root} holds another sweep (differs in: {', '.join(changed)}); "
                    "re-run with --new to start over (the old results move to superseded-<time>/), "
                    "or pick another --out"
                )
            self._supersede()
        elif self.root.exists() and any(self.root.iterdir()):
            raise SweepError(f"{self.root} is not empty and holds no sweep manifest; pick another --out")
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"schema": SCHEMA, "identity": identity, **context})
        return False

    def _supersede(self) -> None:
        dest = self.root / f"superseded-{utc_now().replace(':', '')}"
        dest.mkdir()
        for entry in self.root.iterdir():
            if entry != dest and not entry.name.startswith("superseded-"):
                shutil.move(str(entry), dest / entry.name)

    # --- events -----------------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> None:
        """Append one line and sync it: the log is the sweep's own account of what happened."""
        line = json.dumps({"time": utc_now(), "event": kind, **fields}, sort_keys=False)
        with open(self.root / EVENTS, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    # --- per point --------------------------------------------------------------------------

    def point_dir(self, point: Point) -> Path:
        return self.root / "points" / point.id

    def result_path(self, point: Point, case: Case, repeat: int) -> Path:
        return self.point_dir(point) / f"{case.id}-r{repeat}.json"

    def log_path(self, point: Point) -> Path:
        return self.point_dir(point) / "server.log"

    def failure_path(self, point: Point) -> Path:
        return self.point_dir(point) / "failure.json"

    def missing(self, point: Point, cases: list[Case], repeats: int) -> list[tuple[Case, int]]:
        return [(c, r) for c in cases for r in range(1, repeats + 1) if not self.result_path(point, c, r).is_file()]

    def record_failure(self, point: Point, error: str, log_lines: list[str]) -> None:
        write_json_atomic(
            self.failure_path(point),
            {
                "point": point.id,
                "overrides": point.sets,
                "error": error,
                "date": utc_now(),
                "last_log_lines": log_lines,
            },
        )
        self.event("point_failed", point=point.id, error=error)

    def clear_failure(self, point: Point) -> None:
        self.failure_path(point).unlink(missing_ok=True)

    def failure(self, point: Point) -> dict[str, Any] | None:
        path = self.failure_path(point)
        return read_json_object(path, "point failure", SweepError) if path.is_file() else None

    def advice_path(self, family: str, case: Case) -> Path:
        return self.root / "advice" / f"{family}-{case.id}.json"


def tail(path: Path, n: int = 30) -> list[str]:
    """The last `n` lines of a log (the server's own words on why it died)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return f.read().decode(errors="replace").splitlines()[-n:]
    except FileNotFoundError:
        return []
