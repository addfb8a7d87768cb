"""Regen records as speculators' pre-tokenized rows: `input_ids` and `loss_mask`, nothing re-tokenized.

Our records already hold the exact token ids the target was served (prompt in
its chat template, then its own answer) and a 0/1 mask over the answer, which
is what speculators' prepare-data passes straight through when a row carries
both columns. Held-out records (data.is_heldout, the split our evaluation
uses) never reach the speculators data set, so the walk eval stays held out.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...fsio import write_text_atomic
from ..data import Record, read_records, split


def to_row(rec: Record) -> dict:
    return {"id": rec.id, "input_ids": list(rec.input_ids), "loss_mask": list(rec.loss_mask)}


def from_row(row: dict, prompt: str = "", finish: str = "") -> Record:
    """The record a row came from (prompt text and finish reason are not part of a row)."""
    rec = Record(str(row["id"]), prompt, list(row["input_ids"]), list(row["loss_mask"]), finish)
    rec.check("speculators row")
    return rec


def write_rows(regen: Path, out: Path, heldout_fraction: float) -> tuple[int, int]:
    """The training split of `regen` as rows in `out` (JSONL, written whole or not at all);
    returns (rows written, tokens in them)."""
    train, _ = split(read_records(regen), heldout_fraction)
    write_text_atomic(out, "".join(json.dumps(to_row(r), separators=(",", ":")) + "\n" for r in train))
    return len(train), sum(len(r.input_ids) for r in train)
