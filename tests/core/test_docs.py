"""Generated docs: the config reference (docs/configuration.md) from the schema; the patch
table and the backend map (docs/patches.md) from the patch set and the configs."""

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
    sections = {"config-reference": (docs_gen.reference_table, (doc,))}
    assert docs_gen.stale(sections) == []
    monkeypatch.setattr(docs_gen, "FIELDS", FIELDS[:-1])
    assert docs_gen.stale(sections) == [doc]


def test_patch_docs_are_generated_from_the_patch_set_and_the_configs(tmp_path, monkeypatch):
    """docs/patches.md's patch table and backend map come from patches/patchset.py and
    the production configs: a change to either makes them stale."""
    doc = tmp_path / "p.md"
    text = "".join(
        f"{s}\n{make()}\n{e}\n"
        for name, make in (("patch-set", docs_gen.patch_set_tables), ("backend-map", docs_gen.backend_map_table))
        for s, e in [docs_gen.markers(name)]
    )
    doc.write_text(text)
    sections = {"patch-set": (docs_gen.patch_set_tables, (doc,)), "backend-map": (docs_gen.backend_map_table, (doc,))}
    assert docs_gen.stale(sections) == []
    real = docs_gen.backends.load_patch_data()
    monkeypatch.setattr(docs_gen.backends, "load_patch_data", lambda: (real[0][:-1], real[1]))
    assert docs_gen.stale(sections) == [doc]
    assert "| P3 |" in text and "| P9 |" in text  # shipped and retired
    assert "| `production.env` | 0.20.2 | TRITON_MLA" in text
