"""Regen records as speculators' pre-tokenized rows: a round trip on the committed records."""

from __future__ import annotations

import gzip
import json

from kimidflash.train.data import is_heldout, read_records
from kimidflash.train.speculators.rows import from_row, write_rows

from ..support.helpers import ROOT

COMMITTED = ROOT / "drafters" / "smollm2-135m-dflash-data" / "regen.jsonl.gz"


def test_committed_records_round_trip_through_rows_and_held_out_ones_stay_out(tmp_path):
    regen = tmp_path / "regen.jsonl"
    regen.write_bytes(gzip.decompress(COMMITTED.read_bytes()))
    records = read_records(regen)
    rows_file = tmp_path / "rows.jsonl"
    n, tokens = write_rows(regen, rows_file, 0.05)
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    kept = [r for r in records if not is_heldout(r.id, 0.05)]
    assert n == len(rows) == len(kept) and 0 < len(kept) < len(records)
    assert tokens == sum(len(r.input_ids) for r in kept)
    for rec, row in zip(kept, rows, strict=False):
        assert set(row) == {"id", "input_ids", "loss_mask"}  # what prepare-data passes through as it is
        back = from_row(row, rec.prompt, rec.finish_reason)
        assert back == rec  # the very token ids the target was served and answered: nothing re-tokenized
