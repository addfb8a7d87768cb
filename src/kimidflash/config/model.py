"""The typed result of loading an env file, apart from the loader so that the
rules (which the loader runs) can name it without an import cycle."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ..settings import Settings


def hidden_states_layers(text: str) -> list[int]:
    """HIDDEN_STATES_LAYERS ("1,14,27") as layer ids; ValueError names the bad part."""
    ids = []
    for part in text.split(","):
        if not part.strip().isdigit():
            raise ValueError(f"{part.strip()!r} in {text!r} is not a layer id (comma-separated integers >= 0)")
        ids.append(int(part))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{text!r} names a layer twice")
    return ids


Schedule = tuple[tuple[int, int, int], ...]  # (first batch size, last batch size, k), inclusive
SCHEDULE_KEY = "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE"  # the env-file key a schedule is written under


def draft_schedule(text: str) -> Schedule:
    """NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE ("1-2:3,3-64:0") as (from, to, k) ranges in the order given;
    ValueError names the bad part. Whether the ranges fit the server is the rules' business."""
    out = []
    for part in text.split(","):
        rng, sep, k = part.strip().partition(":")
        lo, dash, hi = rng.partition("-")
        if not (sep and dash and lo.strip().isdigit() and hi.strip().isdigit() and k.strip().isdigit()):
            raise ValueError(
                f"{part.strip()!r} in {text!r} is not FROM-TO:K (batch sizes FROM to TO, inclusive, "
                "draft K tokens; e.g. 1-2:3,3-64:0)"
            )
        out.append((int(lo), int(hi), int(k)))
    return tuple(out)


def format_schedule(schedule: Schedule) -> str:
    """The env-file form of a schedule, as `draft_schedule` reads it."""
    return ",".join(f"{lo}-{hi}:{k}" for lo, hi, k in schedule)


@dataclass(frozen=True)
class Config(Settings):
    """A loaded env file: every key's value as a typed attribute (`Settings`), where each came from
    (`sources`, by key: a file, --set, the process environment or "default") and the files read."""

    sources: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    files: list[Path] = field(default_factory=list)

    def digest(self) -> str:
        """sha256 over the files that made this config, in load order (one hash of
        several files, so not fsio.sha256_file)."""
        h = hashlib.sha256()
        for p in self.files:
            h.update(p.read_bytes())
        return h.hexdigest()

    @property
    def speculative(self) -> bool:
        """Drafting happens (extract_hidden_states rides on vLLM's speculative config but drafts nothing)."""
        return self.speculative_method in ("dflash", "eagle3", "ngram")

    @property
    def base_url(self) -> str:
        host = self.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"
