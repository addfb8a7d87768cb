"""Prompt sets and regenerated training records.

Why regenerate: a drafter learns to predict *its target's* continuations, so
the training responses are the target's own greedy answers (seed 003:
PerfectBlend regenerated with Kimi K2.6). A record keeps the exact token ids
the server saw and produced (chat template applied by the server) and a loss
mask: 0 on prompt tokens, 1 on response tokens. Anchors are only drawn where
the mask is 1.

The reference prompt set is synthetic (no dataset can be downloaded here):
task templates crossed with subjects (`prompt_sets.py`), drawn with a seed. The held-out split
is chosen by a hash of the record id, so it never moves when more records are
added, and the benchmark traffic (the bench tool's built-in prompts) is a
different source altogether.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..bench.prompts import PromptError, load_builtin, load_file
from ..errors import DataError
from ..fsio import read_json_object, sha256_file
from ..prompts_real import SPECS, RealPromptsError, training_prompts
from .prompt_sets import TIERS


def synthetic_combos(seed: int) -> list[tuple[str, str]]:
    """Every (template, subject) pair in id order, tier by tier (`prompt_sets.TIERS`): each
    tier's new pairs (those no earlier tier made) shuffled with one seeded generator.

    An earlier tier's order never changes when a tier is added, so `synthetic:N` keeps naming
    the same prompts (and the regen data committed for them stays valid) as the sets grow."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    templates: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()
    for more_t, more_s in TIERS:
        old_t, old_s = set(templates), set(subjects)
        templates, subjects = templates + more_t, subjects + more_s
        tier = [(t, s) for t in templates for s in subjects if not (t in old_t and s in old_s)]
        rng.shuffle(tier)
        out += tier
    return out


def synthetic_prompts(n: int, seed: int) -> list[dict[str, str]]:
    """`n` distinct prompts {id, prompt}, deterministic in `seed`; a larger n only appends."""
    combos = synthetic_combos(seed)
    if n > len(combos):
        raise DataError(f"synthetic prompt set has {len(combos)} prompts; {n} asked")
    return [{"id": f"syn-{seed}-{i:05d}", "prompt": t.format(s=s)} for i, (t, s) in enumerate(combos[:n])]


def load_prompts(spec: str, seed: int, *, evaluation_only: bool = False) -> list[dict[str, str]]:
    """`synthetic:N`, `bigbench:train` or `bigbench:train-wide` (real prompts, `kimidflash.prompts_real`;
    `bigbench:heldout`, `humaneval` and `mt-bench` only into an `evaluation_only` run), a JSONL file of {id?, prompt}
    / bench conversation records (first user turn), or several of these joined by `+`: one list in
    the order given (regen answers the first source first), an id given twice refused."""
    if "+" in spec:
        out: list[dict[str, str]] = []
        seen: set[str] = set()
        for part in spec.split("+"):
            for p in load_prompts(part.strip(), seed, evaluation_only=evaluation_only):
                if p["id"] in seen:
                    raise DataError(f"prompts '{spec}': id {p['id']} comes twice (from '{part.strip()}')")
                seen.add(p["id"])
                out.append(p)
        return out
    if spec in SPECS or spec.startswith("bigbench:"):
        try:
            return training_prompts(spec, evaluation_only=evaluation_only)
        except RealPromptsError as e:
            raise DataError(str(e)) from None
    if spec.startswith("synthetic:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            raise DataError(f"prompts '{spec}': expected synthetic:N") from None
        return synthetic_prompts(n, seed)
    if spec == "builtin":
        return [{"id": c.id, "prompt": c.turns[0]} for c in load_builtin()]
    if spec.startswith(SELFSYNTH):
        return [{"id": r.id, "prompt": r.prompt} for r in selfsynth_records(spec)]
    path = Path(spec).expanduser()
    if not path.is_file():
        raise DataError(f"prompts file not found: {path}")
    try:
        return [{"id": c.id, "prompt": c.turns[0]} for c in load_file(path)]
    except PromptError as e:
        raise DataError(str(e)) from None


SELFSYNTH = "selfsynth:"  # data.prompts: conversations the target wrote itself (train/selfsynth.py), answered too


SHARDS_MANIFEST = "manifest.json"


def read_shard(path: Path) -> list[Record]:
    """One gzip JSONL shard of records, as `kimidflash self-synth` writes them."""
    with gzip.open(path, "rt") as f:
        return [Record(**json.loads(line)) for line in f if line.strip()]


def verify_shards(folder: Path) -> dict[str, Any]:
    """A shard folder's manifest, each shard's sha256 checked: what a run reads is what was written."""
    doc = read_json_object(folder / SHARDS_MANIFEST, "self-synthesis manifest", DataError)
    for entry in doc["shards"]:
        path = folder / entry["file"]
        if not path.is_file() or sha256_file(path) != entry["sha256"]:
            raise DataError(f"{path}: missing, or not the shard its manifest names (sha256 {entry['sha256'][:12]})")
    return doc


def selfsynth_records(spec: str) -> list[Record]:
    """The verified shards' records of `selfsynth:DIR` (regen copies them: their answers are the target's)."""
    folder = Path(spec.removeprefix(SELFSYNTH)).expanduser()
    return [r for entry in verify_shards(folder)["shards"] for r in read_shard(folder / entry["file"])]


@dataclass
class Record:
    id: str
    prompt: str
    input_ids: list[int]
    loss_mask: list[int]
    finish_reason: str

    @property
    def n_response(self) -> int:
        return sum(self.loss_mask)

    def check(self, where: str) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise DataError(f"{where}: record {self.id}: input_ids and loss_mask differ in length")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise DataError(f"{where}: record {self.id}: loss_mask holds values other than 0/1")


def make_record(rid: str, prompt: str, prompt_ids: list[int], response_ids: list[int], finish: str) -> Record:
    return Record(
        rid, prompt, list(prompt_ids) + list(response_ids), [0] * len(prompt_ids) + [1] * len(response_ids), finish
    )


def read_records(path: Path) -> list[Record]:
    """A regen file's records (none when it does not exist yet); `.gz` is read through gzip, as the
    shipped drafters' data folders commit it."""
    out: list[Record] = []
    if not path.is_file():
        return out
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = Record(**json.loads(line))
        except (json.JSONDecodeError, TypeError) as e:
            raise DataError(f"{path}:{n}: not a regen record ({e})") from None
        rec.check(f"{path}:{n}")
        out.append(rec)
    return out


class RecordWriter:
    """Appends records one line at a time, flushed: an interrupted regen loses at most the line in flight."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a")  # noqa: SIM115 - the writer owns it until close()

    def write(self, rec: Record) -> None:
        self.write_many([rec])

    def write_many(self, recs: Iterable[Record]) -> None:
        """Whole lines, then one flush and fsync (a batch of records costs one sync)."""
        self._f.write("".join(json.dumps(asdict(r), separators=(",", ":")) + "\n" for r in recs))
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


ID_TAG = "[a-z]+"  # a self-synthesis folder's tag in its record ids (selfsynth-TAG-00003-0017: a steered folder)
# train/selfsynth.py's id of a conversation's later turn
_LATER_TURN = re.compile(rf"(selfsynth(?:-{ID_TAG})?-\d+-\d+)-t\d+")


def conversation_of(rid: str) -> str:
    """The conversation a record belongs to: a later turn's record (`selfsynth-00003-0017-t2`) holds
    every earlier turn of `selfsynth-00003-0017` in its prompt, so the two must fall on the same side
    of the split, or the held-out walk reads text the drafter trained on."""
    m = _LATER_TURN.fullmatch(rid)
    return m.group(1) if m else rid


def is_heldout(rid: str, fraction: float) -> bool:
    """Stable split by hash of the record's conversation id: adding records never moves an old one,
    and every turn of a conversation goes where its first went."""
    h = int(hashlib.sha256(conversation_of(rid).encode()).hexdigest()[:8], 16)
    return h < fraction * 0x100000000


def split(records: Iterable[Record], heldout_fraction: float) -> tuple[list[Record], list[Record]]:
    train: list[Record] = []
    held: list[Record] = []
    for r in records:
        (held if is_heldout(r.id, heldout_fraction) else train).append(r)
    return train, held


def usable(records: Iterable[Record], min_response: int = 2) -> Iterator[Record]:
    """Records with at least `min_response` response tokens (an anchor needs a token after it)."""
    return (r for r in records if r.n_response >= min_response)
