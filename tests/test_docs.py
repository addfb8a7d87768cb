"""The config reference in README.md and docs/ is generated from the schema."""

from kimidflash import docs_gen
from kimidflash.config import FIELDS


def test_docs_agree_with_the_schema():
    assert docs_gen.stale() == [], "run: python -m kimidflash config-docs"


def test_table_lists_every_key_once():
    table = docs_gen.reference_table()
    for f in FIELDS:
        assert table.count(f"| `{f.name}` |") == 1


def test_a_schema_change_makes_the_docs_stale(tmp_path, monkeypatch):
    doc = tmp_path / "d.md"
    doc.write_text(f"x\n{docs_gen.START}\n{docs_gen.reference_table()}\n{docs_gen.END}\ny\n")
    assert docs_gen.stale((doc,)) == []
    monkeypatch.setattr(docs_gen, "FIELDS", FIELDS[:-1])
    assert docs_gen.stale((doc,)) == [doc]
