"""`kimidflash draft-vocab`'s command line: its options parsed and checked, then `draft_vocab.py` called."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..checkpoint_layout import require_config
from ..errors import TrainConfigError
from ..fsio import sha256_file
from ..paths import portable
from . import draft_vocab as _domain
from .data import read_records
from .draft_vocab import FREQUENT, attach, choose, coverage, rule


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kimidflash draft-vocab", description=_domain.__doc__.splitlines()[0])
    p.add_argument("drafter", type=Path, help="an exported drafter that scores through the target's head")
    p.add_argument("--target", type=Path, required=True, help="the target checkpoint whose head rows it takes")
    p.add_argument(
        "--records",
        type=Path,
        action="append",
        required=True,
        help="regen records the drafter trained on (.jsonl or .jsonl.gz; repeatable)",
    )
    p.add_argument("--size", type=int, required=True, help="tokens in the draft vocabulary")
    p.add_argument(
        "--frequent",
        type=float,
        default=FREQUENT,
        help="the share chosen by answer-token frequency in --records (the rest: lowest ids)",
    )
    p.add_argument("--out", type=Path, required=True, help="the new drafter folder (replaced whole)")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    for path in (a.drafter / "config.json", a.drafter / "model.safetensors", *a.records):
        if not path.is_file():
            raise TrainConfigError(f"{path}: no such file")
    records = [r for path in a.records for r in read_records(path)]
    if not records:
        raise TrainConfigError(f"--records {' '.join(map(str, a.records))}: no records")
    vocab_size = require_config(a.drafter, "--drafter", TrainConfigError)["vocab_size"]
    ids = choose(records, a.size, vocab_size, a.frequent)
    cov = coverage(records, ids)
    attach(
        a.drafter,
        a.target,
        ids,
        a.out,
        {
            "rule": rule(a.frequent, "the records"),
            "records": [{"path": portable(r), "sha256": sha256_file(r)} for r in a.records],
            "record_count": len(records),
            "record_answer_coverage": cov,
        },
    )
    print(
        f"draft-vocab: {a.out}: {len(ids)} of {vocab_size} tokens; they cover {cov:.2%} of the records' answer tokens"
    )
    return 0
