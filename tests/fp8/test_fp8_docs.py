"""docs/fp8-kv.md's figures come from the code that computes them."""

from __future__ import annotations

import re

from kimidflash.fp8.capacity import GIB, KIMI_K26, table
from kimidflash.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "fp8-kv.md"
# The seed's KV capacities (BF16, FP8), quoted in the doc as the seed's.
SEED_TOKENS = (1_230_368, 2_469_568)


def doc_table() -> list[list[str]]:
    text = DOC.read_text()
    block = text[text.index("<!-- capacity-table -->") : text.index("<!-- /capacity-table -->")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[3:] if line.startswith("|")]


def test_capacity_table_is_the_capacity_module():
    rows = [
        [str(r["dtype"]), str(r["bytes_per_entry"]), str(r["bytes_per_token"]), str(r["tokens_per_gib"])]
        for r in table()
    ]
    assert doc_table() == rows
    assert rows[0][1:3] == ["1152", "70272"]  # (512 + 64) x 2 bytes, x 61 layers


def test_seed_capacities_are_the_same_memory_at_both_sizes():
    """The doc's arithmetic on the seed's two capacities (80.5 and 80.8 GiB)."""
    text = DOC.read_text()
    for tokens, per_token in zip(SEED_TOKENS, (KIMI_K26.bytes_per_token(2), KIMI_K26.bytes_per_token(1)), strict=False):
        gib = f"{tokens * per_token / GIB:.1f} GiB"
        assert re.search(rf"{tokens:,} x {per_token:,} B =\s+{re.escape(gib)}", text), gib
