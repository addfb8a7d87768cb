"""Drafter A/B on your own traffic (seed 002: a drafter tuned on one distribution can lose on yours).

One command replays the same traffic (a prompt JSONL or a multi-turn
conversation file, or the bench tool's built-in set) against the target
served with each variant in turn -- drafters A, B, ..., ngram, no speculation
-- through our `serve` path and the benchmark tool's runner, at each
concurrency, and then prints acceptance per position and output tok/s side
by side (the bench tool's `compare`), with charts and a Markdown report.

    python -m kimidflash ab configs/cpu-reference.env \
        --drafter shipped=drafters/smollm2-135m-dflash --ngram --none \
        --prompts my-traffic.jsonl --concurrency 1 8 --out benchmarks/drafter/ab

Every result file records the recipe config and the overrides the server ran
with (provenance), so a reader can tell which drafter produced which figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..background import serving_process, sigterm_as_interrupt
from ..config import SCHEDULE_KEY, load_config, parse_overrides
from ..config.rules import block_serves, read_json
from ..errors import EXIT_INTERRUPTED
from ..fsio import write_json_atomic, write_text_atomic
from ..paths import include_path, portable
from ..prepare import prepare
from ..sweep.schedule import checked_schedule, fastest_k, k_at
from . import categories as cat_mod
from .categories import Category
from .report import compare
from .resultfile import load_result, write_result
from .runner import BenchConfig, run_benchmark
from .workloads import WORKLOADS

SHIPPED = "as shipped"
HOLDS = 0.98  # the shipped config holds where it serves at least this share of no speculation


def drafter_block_size(label: str, path: Path) -> int | None:
    """The block size in a drafter's config.json, so `--k 3 7` serves each drafter
    only at the k its blocks allow (preflight would refuse the rest mid-run)."""
    try:
        data = read_json(path / "config.json")
    except ValueError as exc:  # read_json names the file and the parse error
        raise ValueError(f"--drafter {label}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--drafter {label}: {path}/config.json is not a JSON object")
    block = data.get("block_size")
    return None if block is None else int(block)


DEFAULT_K = [7]  # --k when a --drafter or --ngram variant is given without it


def drafter_spec(spec: str) -> tuple[str, Path]:
    """`--drafter LABEL=DIR` as its label and resolved directory."""
    if "=" not in spec:
        raise ValueError(f"--drafter {spec}: expected LABEL=DIR")
    label, d = spec.split("=", 1)
    return label, Path(d).expanduser().resolve()


def variants(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    if args.k and not (args.drafter or args.ngram):
        raise ValueError(f"--k {' '.join(map(str, args.k))}: only --drafter and --ngram variants take a k, and "
                         "none is given; to serve the config's own drafter at a static k, name it: --drafter LABEL=DIR")
    given_k = args.k or DEFAULT_K
    for spec in args.drafter:
        label, path = drafter_spec(spec)
        if not (path / "config.json").is_file():
            raise ValueError(f"--drafter {label}: {path}/config.json not found")
        block = drafter_block_size(label, path)
        ks = [k for k in given_k if block is None or block_serves(block, k)]
        if not ks:
            raise ValueError(f"--drafter {label}: its blocks of {block} serve none of "
                             f"--k {' '.join(map(str, given_k))}")
        if ks != given_k:
            print(f"ab: {label} served at k={' '.join(map(str, ks))} only: its blocks of {block} serve no more",
                  file=sys.stderr)
        for k in ks:  # a drafter at a static k: a schedule the base config ships is emptied
            out.append((f"{label} k={k}", ["SPECULATIVE_METHOD=dflash", f"DRAFT_MODEL_DIR={path}",
                                           f"NUM_SPECULATIVE_TOKENS={k}", f"{SCHEDULE_KEY}="]))
    if args.none:
        out.append(("no speculation", ["SPECULATIVE_METHOD=none"]))
    if args.as_shipped:  # the config file as it is, its draft schedule included
        if not args.none:
            raise ValueError("--as-shipped is checked against the best other variant, no speculation "
                             "included: add --none")
        out.append((SHIPPED, []))
    if args.ngram:
        for k in args.ngram_k or given_k:
            out.append((f"ngram k={k}", ["SPECULATIVE_METHOD=ngram", f"NUM_SPECULATIVE_TOKENS={k}",
                                         f"{SCHEDULE_KEY}="]))
    if not out:
        raise ValueError("nothing to compare: give --drafter, --ngram, --none or --as-shipped")
    return out


def run_ab(args: argparse.Namespace) -> list[Path]:
    """Serve each variant in turn and benchmark it at each concurrency; with
    `--rounds N` the whole cycle runs N times, so a machine that drifts (a shared
    CPU host does, by ~10% between sessions here) drifts under every variant, and
    `compare` averages the rounds. Even rounds run the variants in reverse order
    (A B, B A, ...): whatever a variant's place in the cycle costs (the previous
    server still exiting, a warmer page cache) falls on each variant equally."""
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    config = load_config(args.serve_config, parse_overrides(list(args.set)))
    cats = categories(args)
    if "tools" in args.workload and not config["TOOL_CALL_PARSER"]:
        raise ValueError(f"--workload tools: {args.serve_config} sets no TOOL_CALL_PARSER, and vLLM refuses "
                         "tool_choice without one (--set TOOL_CALL_PARSER=...)")
    if config["RUNTIME"] != "docker":  # serve's own step, run first so a --drafter it generates (the tiny pair)
        prepare(config, log=lambda m: print(f"ab: {m}", file=sys.stderr))  # exists when variants() reads it
    todo = variants(args)
    for r in range(1, args.rounds + 1):
        for label, sets in (todo if r % 2 else todo[::-1]):
            files += _run_variant(args, out, label, sets + list(args.set), r if args.rounds > 1 else None, cats)
    return files


def categories(args: argparse.Namespace) -> list[Category]:
    """`--category` (with `--by-kind`, `--multi-turn`), else the one unnamed category of `--prompts`;
    each once per `--workload`."""
    if args.category:
        if args.prompts:
            raise ValueError("give --prompts or --category, not both")
        cats = cat_mod.parse_categories(args.category, args.by_kind, args.multi_turn, args.turns)
    elif args.by_kind or args.multi_turn or args.offline_category:
        raise ValueError("--by-kind, --multi-turn and --offline-category work on --category files: name one")
    else:
        cats = [Category(None, args.prompts, None, args.turns)]
    return cat_mod.with_workloads(cats, args.workload)


def _run_variant(args: argparse.Namespace, out: Path, label: str, sets: list[str], rnd: int | None,
                 cats: list[Category]) -> list[Path]:
    """One variant served once, benchmarked in every category at every concurrency not already on disk
    (`--reuse`)."""
    suffix = f"-r{rnd}" if rnd else ""
    name = f"{label} round {rnd}" if rnd else label
    slug = label.replace(" ", "-").replace("=", "")
    paths = {(cat, c): out / f"{slug}{'-' + cat.slug if cat.name else ''}-c{c}{suffix}.json"
             for cat in cats for c in args.concurrency}
    todo = [key for key, path in paths.items() if not (args.reuse and path.is_file())]
    if todo:
        print(f"ab: serving {name} ({' '.join(sets)})", file=sys.stderr)
        with serving_process(args.serve_config, sets, out / f"{slug}{suffix}-server.log") as (proc, base):
            for cat, c in todo:
                cfg = BenchConfig(base_url=f"{base}/v1", sessions=args.sessions, concurrency=c,
                                  turns_per_session=cat.turns, max_tokens=args.max_tokens,
                                  temperature=args.temperature, seed=args.seed, prompts=cat.prompts,
                                  kind=cat.kind, category=cat.name, workload=cat.workload,
                                  warmup=args.warmup, label=label, recipe_config=str(args.serve_config),
                                  recipe_overrides=parse_overrides(sets),
                                  ignore_eos=args.ignore_eos, server_pid=proc.pid, progress=True)
                doc = run_benchmark(cfg)
                doc.setdefault("notes", []).append(f"kimidflash ab variant '{name}'")
                write_result(paths[(cat, c)], doc)
                print(f"ab: {name}{' ' + cat.name if cat.name else ''} c={c}: {doc.get('output_throughput')} "
                      f"output tok/s, acceptance length {doc.get('spec_decode_acceptance_length')}", file=sys.stderr)
                if doc.get("server_cpu"):
                    cpu = doc["server_cpu"]
                    print("ab:   server CPU ms per output token: " + ", ".join(
                        f"{r['process']} {r['ms_per_output_token']}" for r in cpu["processes"]) +
                        f"; host busy {cpu['host_busy_fraction']}", file=sys.stderr)
    return list(paths.values())


def offline_files(specs: list[str], labels: list[str]) -> dict[str | None, Path]:
    """--offline values: `LABEL=FILE` for one drafter, a bare FILE for every drafter."""
    out: dict[str | None, Path] = {}
    for spec in specs:
        label, sep, path = spec.partition("=")
        if sep and label in labels:
            if not Path(path).is_file():
                raise FileNotFoundError(f"--offline {spec}: {path} not found")
            out[label] = Path(path)
        elif Path(spec).is_file():
            out[None] = Path(spec)
        elif sep:
            raise ValueError(f"--offline {spec}: no --drafter is labelled {label!r}, and no file is named so")
        else:
            raise FileNotFoundError(f"--offline {spec}: not found")
    return out


def offline_vs_online(files: list[Path], offline: dict[str | None, Path], out: Path) -> str:
    """A Markdown table: offline (eval phase) and online (/metrics) acceptance per k, from the files alone.
    Each drafter's rows take its own eval file (`offline[label]`), else the one for every drafter. The walk
    column (eval files since the walk was added) is the offline figure comparable with /metrics."""
    docs = {label: json.loads(path.read_text()) for label, path in offline.items()}
    lines = [f"Offline{'' if label is None else f' ({label})'}: `{portable(path)}` (step {docs[label].get('step')}, "
             f"{docs[label].get('split', 'heldout')} split, {docs[label].get('definition', '')})."
             for label, path in offline.items()]
    lines += ["Online: vLLM /metrics deltas in the result files below.", "",
              "| variant | concurrency | k | offline mean acceptance length | offline, as a server walks | "
              "online mean acceptance length | offline per position | online per position | output tok/s | file |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for f in files:
        doc = load_result(f)
        label = doc.get("label", "")
        k = (doc.get("provenance", {}).get("recipe_config") or {}).get("values", {}).get("NUM_SPECULATIVE_TOKENS")
        off = docs.get(label.split(" k=")[0], docs.get(None)) if "k=" in label and not label.startswith("ngram") else None
        o = off["by_k"].get(str(k)) if off else None
        lines.append(f"| {label} | {doc.get('max_concurrency')} | {k if doc.get('speculative') else '-'} | "
                     f"{o['mean_acceptance_length'] if o else '-'} | {(o or {}).get('walk', {}).get('mean_acceptance_length', '-')} | "
                     f"{doc.get('spec_decode_acceptance_length') or '-'} | "
                     f"{o['per_position'] if o else '-'} | {doc.get('spec_decode_per_position_acceptance_rates') or '-'} | "
                     f"{doc.get('output_throughput')} | {f.name} |")
    text = "\n".join(lines) + "\n"
    (out / "offline-vs-online.md").write_text(text)
    return text


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
            s: c["output_tps"] for s, c in r["series"].items() if s != SHIPPED and c["output_tps"]}
        best = max((s for s in others if others[s]), key=lambda s: others[s])
        rows.append({"category": r["category"], "concurrency": r["concurrency"], "as_shipped_tps": cell["output_tps"],
                     "best_other": best, "best_other_tps": others[best],
                     "ratio": cell["output_tps"] / others[best], "runs": cell["runs"],
                     "lost_to_none": bool(r["baseline_tps"]) and cell["output_tps"] < HOLDS * r["baseline_tps"],
                     "pooled": r["members"] != [r["category"]],  # several categories' rows again: not a candidate
                     "candidates": [[0, r["baseline_tps"]]] + [[k, others[s]] for s, k in statics.items()
                                                               if s in others]})
    return {"definition": "as-shipped output tok/s / the best other variant's in the same category and "
                          "concurrency, every round pooled", "rows": rows}


def own_statics(series: list[str], drafters: list[str], config: Path, sets: list[str]) -> dict[str, int]:
    """The series that serve the config's own drafter (`--drafter LABEL=DIR` naming its DRAFT_MODEL_DIR) at a
    static k: label -> k."""
    own = load_config(config, parse_overrides(sets))["DRAFT_MODEL_DIR"]
    labels = [label for label, path in map(drafter_spec, drafters) if own and path == Path(own).resolve()]
    return {s: int(s.rpartition(" k=")[2]) for s in series for label in labels
            if s.startswith(f"{label} k=") and s.rpartition(" k=")[2].isdigit()}


def checked(check: dict[str, Any], config: Path, sets: list[str]) -> dict[str, Any] | None:
    """The config with the k the check measured fastest at each concurrency (no speculation, the config as
    shipped, its drafter at each static k measured; in every category), with the overrides that make it;
    None where the config as shipped was that."""
    cfg = load_config(config, parse_overrides(sets))
    rows = [r for r in check["rows"] if not r.get("pooled")]
    best = {c: fastest_k([r for r in rows if r["concurrency"] == c], k_at(cfg, c))
            for c in sorted({r["concurrency"] for r in rows})}
    fix = checked_schedule(cfg, best)
    if fix is not None:
        load_config(config, parse_overrides([*sets, *fix["sets"]]))  # the rules accept what is written
        fix["sets"] = [*sets, *fix["sets"]]
    return fix


def write_shipped_check(check: dict[str, Any], out: Path, config: Path) -> str:
    lines = ["| category | users | as shipped tok/s | best other | its tok/s | ratio |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['category'] or 'all'} | {r['concurrency']} | {r['as_shipped_tps']:.1f} | {r['best_other']} | "
              f"{r['best_other_tps']:.1f} | {r['ratio']:.3f}x |" for r in check["rows"]]
    lines += ["", f"- ratio: {check['definition']}"]
    fix = check.get("checked_schedule")
    if fix is not None:
        where = "; ".join(f"{d['concurrency']} users: k={d['k']}, not the shipped k={d['shipped_k']}"
                          for d in fix["by_concurrency"] if d["concurrency"] in fix["changed_at"])
        lines.append(f"- measured faster at {where}. `checked.env` serves {fix['serves']} (each such k from "
                     "its concurrency up to the next measured, the rest as shipped); verify it with another "
                     "interleaved run before shipping it")
        write_text_atomic(out / "checked.env", "\n".join([
            f"# {config.name} with the k that `kimidflash ab --as-shipped` measured fastest where it differs",
            f"# ({where}; shipped-check.md beside this file). Serve it with: ./serve.sh <this file>",
            f"INCLUDE={include_path(config, out)}", *fix["sets"]]) + "\n")
    else:
        (out / "checked.env").unlink(missing_ok=True)  # an older check's correction no longer applies
    text = "\n".join(lines) + "\n"
    write_json_atomic(out / "shipped-check.json", check)
    write_text_atomic(out / "shipped-check.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kimidflash ab", description=__doc__.splitlines()[0])
    p.add_argument("serve_config", type=Path)
    p.add_argument("--drafter", action="append", default=[], metavar="LABEL=DIR")
    p.add_argument("--ngram", action="store_true")
    p.add_argument("--none", action="store_true", help="include the no-speculation baseline")
    p.add_argument("--as-shipped", action="store_true",
                   help="include the config as it is (its draft schedule too), checked against the best other "
                        "variant per concurrency in shipped-check.md (with --none)")
    p.add_argument("--ngram-k", type=int, nargs="+", help="num_speculative_tokens for ngram (default: --k)")
    p.add_argument("--k", type=int, nargs="+",
                   help=f"num_speculative_tokens values for --drafter and --ngram (default {DEFAULT_K[0]}; each "
                        "drafter runs those its block size serves)")
    p.add_argument("--prompts", default=None, help="builtin (default), a JSONL or a ShareGPT file")
    p.add_argument("--category", action="append", default=[], metavar="NAME=FILE",
                   help="benchmark this prompt file as its own category (repeatable; instead of --prompts): "
                        "specbench.md then gives acceptance and speedup per category")
    p.add_argument("--by-kind", action="store_true",
                   help="split each --category file whose records carry several kinds into NAME/kind categories")
    p.add_argument("--multi-turn", action="append", default=[], metavar="NAME=N",
                   help="also run --category NAME's sessions for N turns, as the category 'NAME multi-turn'")
    p.add_argument("--workload", nargs="+", default=["free"], choices=list(WORKLOADS),
                   help="what requests ask for besides their messages; several: each category once per workload, "
                        "in specbench.md as 'CATEGORY WORKLOAD' rows (tools needs the server's TOOL_CALL_PARSER)")
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=1)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra serve override")
    p.add_argument("--reuse", action="store_true", help="skip variants whose result files exist (resume)")
    p.add_argument("--rounds", type=int, default=1,
                   help="cycle through all variants this many times (files get -rN); compare averages the rounds")
    p.add_argument("--out", required=True, help="folder for result files, report.md and charts")
    p.add_argument("--offline", action="append", default=[], metavar="[LABEL=]FILE",
                   help="an eval.json / offline-acceptance.json to set beside online figures: LABEL=FILE for "
                        "that --drafter's rows, FILE for every drafter (repeatable)")
    p.add_argument("--offline-category", action="append", default=[], metavar="LABEL@CATEGORY=FILE",
                   help="an eval.json whose walk acceptance length goes beside --drafter LABEL's row of "
                        "CATEGORY in specbench.md (repeatable)")
    a = p.parse_args(argv)
    try:
        offline = offline_files(a.offline, [d.partition("=")[0] for d in a.drafter])
        walks = cat_mod.offline_walks(a.offline_category)
        with sigterm_as_interrupt():  # else a Ctrl-C inside a benchmark run finishes that run as a result
            files = run_ab(a)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ab: interrupted; finished result files are kept in {a.out}: rerun with --reuse to serve only "
              "what is missing", file=sys.stderr)
        return EXIT_INTERRUPTED
    base = "no speculation" if a.none else None
    named = bool(a.category) or a.workload != ["free"]  # named categories: a report each, and specbench.md
    table = cat_mod.specbench(files, base, walks) if base is not None and (named or a.as_shipped) else None
    if named:
        per_cat: dict[str, list[str]] = {}
        for f in files:
            per_cat.setdefault(load_result(f)["config"]["category"], []).append(str(f))
        for name, group in per_cat.items():
            compare(group, baseline=base, markdown=Path(a.out) / f"report-{cat_mod.slug(name)}.md", terminal=False)
        if table is not None:
            print(cat_mod.write(table, Path(a.out)))
    else:
        compare([str(f) for f in files], baseline=base, markdown=Path(a.out) / "report.md",
                charts=Path(a.out) / "charts")
    if a.as_shipped and table is not None:
        check = shipped_check(table, own_statics(table["series"], a.drafter, a.serve_config, a.set))
        check["checked_schedule"] = checked(check, a.serve_config, a.set)
        print(write_shipped_check(check, Path(a.out), a.serve_config))
    if offline:
        print(offline_vs_online(files, offline, Path(a.out)))
    return 0

