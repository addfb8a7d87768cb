"""The check of a config as shipped (`kimidflash ab --as-shipped`): against the best other variant at each
concurrency, rounds pooled, and the k measured fastest there written back as `checked.env`.

A leaf beside `ab`, which runs the variants: this module only reads the specbench table they made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import load_config
from ..config.schedule import checked_schedule, fastest_k, k_at
from ..fsio import write_json_atomic, write_text_atomic
from ..mdtable import table
from ..paths import include_path

SHIPPED = "as shipped"
HOLDS = 0.98  # the shipped config holds where it serves at least this share of no speculation


def shipped_check(table: dict[str, Any], statics: dict[str, int]) -> dict[str, Any]:
    """Per row of the specbench table: the config as shipped against the best of every other variant
    (no speculation included), rounds pooled: the check that a shipped draft schedule never loses.
    `statics` (series label -> k) are the config's own drafter at a static k: with no speculation, the
    candidates a row offers for the k to serve at its concurrency."""
    rows = []
    for r in table["rows"]:
        cell = r["series"].get(SHIPPED)
        if not cell or not cell["output_tps"]:
            continue
        others = {table["baseline"]: r["baseline_tps"]} | {
            s: c["output_tps"] for s, c in r["series"].items() if s != SHIPPED and c["output_tps"]
        }
        best = max((s for s in others if others[s]), key=lambda s: others[s])
        rows.append(
            {
                "category": r["category"],
                "concurrency": r["concurrency"],
                "as_shipped_tps": cell["output_tps"],
                "best_other": best,
                "best_other_tps": others[best],
                "ratio": cell["output_tps"] / others[best],
                "runs": cell["runs"],
                "lost_to_none": bool(r["baseline_tps"]) and cell["output_tps"] < HOLDS * r["baseline_tps"],
                "pooled": r["members"] != [r["category"]],  # several categories' rows again: not a candidate
                "candidates": [[0, r["baseline_tps"]]] + [[k, others[s]] for s, k in statics.items() if s in others],
            }
        )
    return {
        "definition": "as-shipped output tok/s / the best other variant's in the same category and "
        "concurrency, every round pooled",
        "rows": rows,
    }


def own_statics(series: list[str], drafters: list[tuple[str, Path]], config: Path, sets: list[str]) -> dict[str, int]:
    """The series that serve the config's own drafter (`--drafter LABEL=DIR`, given as (label, resolved DIR),
    naming its DRAFT_MODEL_DIR) at a static k: label -> k."""
    own = load_config(config, sets).draft_model_dir
    labels = [label for label, path in drafters if own and path == Path(own).resolve()]
    return {
        s: int(s.rpartition(" k=")[2])
        for s in series
        for label in labels
        if s.startswith(f"{label} k=") and s.rpartition(" k=")[2].isdigit()
    }


def checked(check: dict[str, Any], config: Path, sets: list[str]) -> dict[str, Any] | None:
    """The config with the k the check measured fastest at each concurrency (no speculation, the config as
    shipped, its drafter at each static k measured; in every category), with the overrides that make it;
    None where the config as shipped was that."""
    cfg = load_config(config, sets)
    rows = [r for r in check["rows"] if not r.get("pooled")]
    best = {
        c: fastest_k([r for r in rows if r["concurrency"] == c], k_at(cfg, c))
        for c in sorted({r["concurrency"] for r in rows})
    }
    fix = checked_schedule(cfg, best)
    if fix is not None:
        load_config(config, [*sets, *fix["sets"]])  # the rules accept what is written
        fix["sets"] = [*sets, *fix["sets"]]
    return fix


def write_shipped_check(check: dict[str, Any], out: Path, config: Path) -> str:
    lines = table(
        ["category", "users", "as shipped tok/s", "best other", "its tok/s", "ratio"],
        [
            [
                r["category"] or "all",
                r["concurrency"],
                f"{r['as_shipped_tps']:.1f}",
                r["best_other"],
                f"{r['best_other_tps']:.1f}",
                f"{r['ratio']:.3f}x",
            ]
            for r in check["rows"]
        ],
    )
    lines += ["", f"- ratio: {check['definition']}"]
    fix = check.get("checked_schedule")
    if fix is not None:
        where = "; ".join(
            [
                f"measured faster at {d['concurrency']} users: k={d['k']}, not the shipped k={d['shipped_k']}"
                for d in fix["by_concurrency"]
                if d["concurrency"] in fix["changed_at"]
            ]
            + (
                [
                    f"batch size{'s' if len(fix['between']) > 1 else ''} {', '.join(map(str, fix['between']))}, not "
                    "measured, at the k of the next measured load above (k falls with load)"
                ]
                if fix["between"]
                else []
            )
        )
        lines.append(
            f"- {where}. `checked.env` serves {fix['serves']} (batch sizes between two measured loads "
            "at the k of the one above, as a sweep's schedule; below the smallest as shipped); verify it "
            "with another interleaved run before shipping it"
        )
        write_text_atomic(
            out / "checked.env",
            "\n".join(
                [
                    f"# {config.name} with the k that `kimidflash ab --as-shipped` measured fastest where it differs",
                    f"# ({where}; shipped-check.md beside this file). Serve it with: ./serve.sh <this file>",
                    f"INCLUDE={include_path(config, out)}",
                    *fix["sets"],
                ]
            )
            + "\n",
        )
    else:
        (out / "checked.env").unlink(missing_ok=True)  # an older check's correction no longer applies
    text = "\n".join(lines) + "\n"
    write_json_atomic(out / "shipped-check.json", check)
    write_text_atomic(out / "shipped-check.md", text)
    return text
