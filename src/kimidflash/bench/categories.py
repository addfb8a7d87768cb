"""Per-category A/B in the manner of SpecBench: one table of acceptance length and
speedup over no speculation, category by category, from `kimidflash ab` result files.

A drafter can win on one kind of request and lose on another (seed 002), and a
single pooled figure hides which. So `ab --category NAME=FILE` benchmarks each
named prompt file as its own category, `--by-kind` splits a file whose records
carry several `kind`s into `NAME/kind` categories, and `--multi-turn NAME=N`
adds `NAME multi-turn`: the same file's sessions run for N turns (the first
user turn from the file, later ones the benchmark's generic follow-ups, the
assistant turns the server's own answers).

Every result file records its category (`config.category`), so the table is
rebuilt from the files alone. Figures per (category, series, concurrency) pool
every round: throughput is total output tokens over total measured seconds,
acceptance length 1 + accepted / drafts from the server's /metrics deltas. A
source split by kind also gets a row pooling its kinds, and the table ends with
a row pooling every single-turn category.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BenchError, PromptError
from ..fsio import read_json_object, write_json_atomic, write_text_atomic
from ..mdtable import table as md_table
from .prompts import kinds, load_source
from .resultfile import load_result

ALL = "all single-turn categories"


@dataclass(frozen=True)
class Category:
    name: str | None  # None: the run has no categories (plain `--prompts`)
    prompts: str | None
    kind: str | None = None
    turns: int = 1
    workload: str = "free"  # what each request asks for besides its messages (workloads.py)

    @property
    def slug(self) -> str:
        return "" if self.name is None else slug(self.name)


def with_workloads(cats: Sequence[Category], workloads: Sequence[str]) -> list[Category]:
    """Each category once per workload, named `NAME WORKLOAD` (the workload alone for a run without
    categories), so one run measures what a constraint costs speculation on the same prompts. One
    free-text workload leaves the categories as they are."""
    if list(workloads) == ["free"]:
        return list(cats)
    if len(set(workloads)) != len(workloads):
        raise BenchError(f"--workload {' '.join(workloads)}: a workload given twice")
    return [Category(f"{c.name} {w}" if c.name else w, c.prompts, c.kind, c.turns, w) for c in cats for w in workloads]


def slug(name: str) -> str:
    """A category's name as it appears in file names."""
    return name.replace("/", "-").replace(" ", "-")


def _pairs(specs: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name or not value:
            raise BenchError(f"{flag} {spec}: expected NAME=VALUE")
        out.append((name, value))
    return out


def parse_categories(
    specs: Sequence[str],
    by_kind: bool = False,
    multi_turn: Sequence[str] = (),
    turns: int = 1,
    only_kinds: Sequence[str] = (),
) -> list[Category]:
    """The categories `ab` runs, in order: each `--category NAME=FILE` (split by kind with `by_kind`
    when its records carry more than one, or into the `only_kinds` it holds: `--kind`, for when one
    kind costs far more than the others), then the `--multi-turn NAME=N` ones."""
    if only_kinds and not by_kind:
        raise BenchError("--kind picks kinds of a --by-kind split: add --by-kind")
    cats: list[Category] = []
    files: dict[str, str] = {}
    seen: set[str] = set()
    for name, path in _pairs(specs, "--category"):
        if name in files:
            raise BenchError(f"--category {name}: given twice")
        if "/" in name:
            raise BenchError(f"--category {name}: a name may not hold '/' (by-kind categories are NAME/kind)")
        try:
            found = kinds(load_source(path))
        except (PromptError, OSError) as e:
            raise BenchError(f"--category {name}: {e}") from None
        files[name] = path
        seen.update(found)
        if only_kinds:  # named NAME/kind even where one is left, so its files sort with the others'
            cats += [Category(f"{name}/{k}", path, k, turns) for k in found if k in only_kinds]
        elif by_kind and len(found) > 1:
            cats += [Category(f"{name}/{k}", path, k, turns) for k in found]
        else:
            cats.append(Category(name, path, None, turns))
    missing = [k for k in only_kinds if k not in seen]
    if missing:
        raise BenchError(f"--kind {missing[0]}: no --category file holds it; they hold {', '.join(sorted(seen))}")
    for name, n in _pairs(multi_turn, "--multi-turn"):
        if name not in files:
            raise BenchError(f"--multi-turn {name}={n}: no --category is named {name!r}")
        if not n.isdigit() or int(n) < 2:
            raise BenchError(f"--multi-turn {name}={n}: the number of turns must be 2 or more")
        cats.append(Category(f"{name} multi-turn", files[name], None, int(n)))
    return cats


# --- the table ------------------------------------------------------------------------------


@dataclass
class _Pool:
    tokens: float = 0.0
    seconds: float = 0.0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    decode_tokens: int = 0  # every token after a request's first
    decode_seconds: float = 0.0  # from each request's first token to its last
    runs: int = 0

    def add(self, doc: dict[str, Any]) -> None:
        self.tokens += doc.get("total_output_tokens") or 0
        self.seconds += doc.get("duration") or 0.0
        self.drafts += doc.get("spec_decode_num_drafts") or 0
        self.draft_tokens += doc.get("spec_decode_draft_tokens") or 0
        self.accepted += doc.get("spec_decode_accepted_tokens") or 0
        for r in doc.get("requests") or []:
            if not r.get("error") and r.get("ttft_ms") is not None and (r.get("output_tokens") or 0) > 1:
                self.decode_tokens += r["output_tokens"] - 1
                self.decode_seconds += (r["e2el_ms"] - r["ttft_ms"]) / 1e3
        self.runs += 1

    @property
    def decode_tps(self) -> float | None:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else None

    @property
    def tokens_per_draft(self) -> float | None:
        return self.draft_tokens / self.drafts if self.drafts else None

    @property
    def tps(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None

    @property
    def acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None


def _order(values: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def specbench(
    files: Sequence[Path], baseline: str, offline: dict[tuple[str, str], float] | None = None
) -> dict[str, Any]:
    """The table as data: per row (category, concurrency), per drafter series: online acceptance
    length, throughput and speedup over `baseline` in the same row; `offline[(series label,
    category)]` an offline walk figure to set beside it."""
    loaded = [(f, load_result(f)) for f in files]
    docs = [d for _, d in loaded if not d.get("partial")]
    partial = [f.name for f, d in loaded if d.get("partial")]  # cut short: its tokens and seconds are no run's

    def cat(d: dict[str, Any]) -> str:
        return str((d.get("config") or {}).get("category"))

    parents = {cat(d): cat(d).split("/")[0] if "/" in cat(d) else None for d in docs}  # NAME/kind
    series = _order(d["label"] for d in docs)
    if baseline not in series:
        raise BenchError(f"no result files for the baseline {baseline!r} (series: {', '.join(series)})")
    rows: list[dict[str, Any]] = []
    groups: list[tuple[str, list[str]]] = []
    for c in _order(cat(d) for d in docs):
        groups.append((c, [c]))
        p = parents.get(c)
        members = [x for x in parents if p is not None and parents[x] == p]
        if p is not None and c == members[-1]:
            groups.append((f"{p} (all kinds)", members))
    single = [c for c in parents if not any(d["turns_per_session"] > 1 for d in docs if cat(d) == c)]
    if len(single) > 1:
        groups.append((ALL, single))
    for name, members in groups:
        for conc in sorted({d["max_concurrency"] for d in docs}):
            pools = {s: _Pool() for s in series}
            for d in docs:
                if cat(d) in members and d["max_concurrency"] == conc:
                    pools[d["label"]].add(d)
            base, base_decode = pools[baseline].tps, pools[baseline].decode_tps
            cells = {}
            for s in series:
                if s == baseline or not pools[s].runs:
                    continue
                tps = pools[s].tps
                decode = pools[s].decode_tps
                cells[s] = {
                    "acceptance_length": pools[s].acceptance_length,
                    "output_tps": tps,
                    "speedup": tps / base if tps and base else None,
                    "runs": pools[s].runs,
                    "drafted_per_draft": pools[s].tokens_per_draft,
                    "decode_speedup": decode / base_decode if decode and base_decode else None,
                    "offline_walk_acceptance_length": _offline(offline or {}, s, name),
                }
            rows.append(
                {
                    "category": name,
                    "members": members,
                    "concurrency": conc,
                    "baseline_tps": base,
                    "baseline_runs": pools[baseline].runs,
                    "series": cells,
                }
            )
    return {
        "baseline": baseline,
        "series": [s for s in series if s != baseline],
        "rows": rows,
        "definitions": {
            "output_tps": "total output tokens / total measured seconds, every round pooled",
            "acceptance_length": "1 + accepted / drafts, vLLM /metrics deltas, every round pooled",
            "speedup": "output_tps / the baseline's in the same category and concurrency",
            "drafted_per_draft": "draft tokens / drafts: below k where a grammar cut drafts short "
            "(a draft cut to nothing is no draft, and leaves the acceptance "
            "length above the tokens a step gives)",
            "decode_speedup": "the same ratio over decode alone: output tokens after each "
            "request's first / the time from its first token to its last, "
            "pooled (no prefill, no queueing)",
        },
        "files": [f.name for f in files],
        "left_out_partial": partial,
    }


def _offline(offline: dict[tuple[str, str], float], series: str, category: str) -> float | None:
    """By the series label ('new k=3') or its drafter's ('new')."""
    return offline.get((series, category), offline.get((series.split(" k=")[0], category)))


def _f(v: float | None, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def render(table: dict[str, Any]) -> str:
    series = table["series"]
    head = ["category", "users", f"{table['baseline']} tok/s"]
    for s in series:
        head += [
            f"{s} AL online",
            f"{s} AL offline walk",
            f"{s} drafted/draft",
            f"{s} tok/s",
            f"{s} speedup",
            f"{s} decode speedup",
        ]
    body = []
    x = lambda v: _f(v, ".2f") + ("x" if v else "")  # noqa: E731  a ratio
    for r in table["rows"]:
        cells = [r["category"], str(r["concurrency"]), _f(r["baseline_tps"], ".1f")]
        for s in series:
            c = r["series"].get(s, {})
            cells += [
                _f(c.get("acceptance_length"), ".2f"),
                _f(c.get("offline_walk_acceptance_length"), ".2f"),
                _f(c.get("drafted_per_draft"), ".2f"),
                _f(c.get("output_tps"), ".1f"),
                x(c.get("speedup")),
                x(c.get("decode_speedup")),
            ]
        body.append(cells)
    lines = md_table(head, body)
    d = table["definitions"]
    notes = [f"- {k}: {v}" for k, v in d.items()]
    if table["left_out_partial"]:
        notes.append(f"- left out, cut short (partial): {', '.join(table['left_out_partial'])}")
    return "\n".join(lines + [""] + notes) + "\n"


def write(table: dict[str, Any], out: Path) -> str:
    """`specbench.json` (the data) and `specbench.md` (the table) in `out`."""
    text = render(table)
    write_json_atomic(out / "specbench.json", table)
    write_text_atomic(out / "specbench.md", "# Per-category acceptance and speedup\n\n" + text)
    return text


def offline_walks(specs: Sequence[str]) -> dict[tuple[str, str], float]:
    """`--offline-category LABEL@CATEGORY=EVAL.json`: the eval file's walk acceptance length (its only
    k) for that drafter's row in that category."""
    out: dict[tuple[str, str], float] = {}
    for key, path in _pairs(specs, "--offline-category"):
        label, sep, category = key.partition("@")
        if not sep:
            raise BenchError(f"--offline-category {key}={path}: expected LABEL@CATEGORY=FILE")
        try:
            doc = read_json_object(path, "offline eval file")
        except ValueError as e:
            raise BenchError(f"--offline-category {key}: {e}") from None
        by_k = doc.get("by_k") or {}
        walks = [v.get("walk", {}).get("mean_acceptance_length") for v in by_k.values()]
        if len(walks) != 1 or walks[0] is None:
            raise BenchError(f"--offline-category {key}: {path} holds no single walk figure (by_k: {list(by_k)})")
        out[(label, category)] = float(walks[0])
    return out
