"""Drafter A/B on your own traffic (seed 002: a drafter tuned on one distribution can lose on yours).

One command replays the same traffic (a prompt JSONL or a multi-turn
conversation file, or the bench tool's built-in set) against the target
served with each variant in turn -- drafters A, B, ... of either family (DFlash
or EAGLE-3, the method read from each drafter's config.json), ngram, no
speculation -- through our `serve` path and the benchmark tool's runner, at each
concurrency, and then prints acceptance per position and output tok/s side
by side (the bench tool's `compare`), with charts and a Markdown report.

    python -m kimidflash ab configs/cpu-reference.env \
        --drafter shipped=drafters/smollm2-135m-dflash --ngram --none \
        --prompts my-traffic.jsonl --concurrency 1 8 --out benchmarks/drafter/ab

Every result file records the recipe config and the overrides the server ran
with (provenance), so a reader can tell which drafter produced which figure.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from ..backends import family_draft_backend, spec_decode_metrics_option
from ..background import serving_process
from ..checkpoint_layout import read_config
from ..config import SCHEDULE_KEY, Config, load_config, parse_overrides
from ..config.drafts import block_size, draft_method
from ..config.rules import block_serves
from ..errors import BenchError
from ..fsio import read_json_object
from ..mdtable import table
from ..paths import portable
from ..prepare import prepare
from . import categories as cat_mod
from .ab_options import AbOptions
from .categories import Category
from .resultfile import load_result, write_result
from .runner import BenchConfig, run_benchmark
from .shipped import SHIPPED


def drafter_family(label: str, path: Path) -> tuple[str, int | None]:
    """The method a drafter's config.json is served with (DFlash or EAGLE-3, so one run compares
    both families) and its block size, so `--k 3 7` serves a DFlash drafter only at the k its
    blocks allow (preflight would refuse the rest mid-run); an EAGLE-3 head has no blocks."""
    try:
        data = read_config(path, ValueError)
    except ValueError as exc:  # the reader names the file and the parse error
        raise BenchError(f"--drafter {label}: {exc}") from None
    if data is None:
        raise BenchError(f"--drafter {label}: {path}/config.json not found")
    method = draft_method(data)
    if method is None:
        raise BenchError(
            f"--drafter {label}: {path}/config.json declares {data.get('architectures')!r}, neither "
            "a DFlash drafter (DFlashDraftModel) nor an EAGLE-3 head (e.g. Eagle3DeepseekV3ForCausalLM, "
            "LlamaForCausalLMEagle3)"
        )
    return method, block_size(data) if method == "dflash" else None


DEFAULT_K = [7]  # --k when a --drafter or --ngram variant is given without it


def drafter_spec(spec: str) -> tuple[str, Path]:
    """`--drafter LABEL=DIR` as its label and resolved directory."""
    if "=" not in spec:
        raise BenchError(f"--drafter {spec}: expected LABEL=DIR")
    label, d = spec.split("=", 1)
    return label, Path(d).expanduser().resolve()


def variants(opts: AbOptions, base: Config | None = None) -> list[tuple[str, list[str]]]:
    """The (label, overrides) of each variant. `base`: the loaded config, from which a drafter of
    the other family than the config's takes the draft backend of its own family (a DFlash config's
    ROCM_ATTN would be refused for an MLA EAGLE-3 head, and the other way round)."""
    out: list[tuple[str, list[str]]] = []
    if opts.k and not (opts.drafter or opts.ngram):
        raise BenchError(
            f"--k {' '.join(map(str, opts.k))}: only --drafter and --ngram variants take a k, and "
            "none is given; to serve the config's own drafter at a static k, name it: --drafter LABEL=DIR"
        )
    given_k = opts.k or DEFAULT_K
    for spec in opts.drafter:
        label, path = drafter_spec(spec)
        if not (path / "config.json").is_file():
            raise BenchError(f"--drafter {label}: {path}/config.json not found")
        method, block = drafter_family(label, path)
        ks = [k for k in given_k if block is None or block_serves(block, k)]
        if not ks:
            raise BenchError(
                f"--drafter {label}: its blocks of {block} serve none of --k {' '.join(map(str, given_k))}"
            )
        if ks != given_k:
            print(
                f"ab: {label} served at k={' '.join(map(str, ks))} only: its blocks of {block} serve no more",
                file=sys.stderr,
            )
        own = family_draft_backend(base, method) if base is not None else None
        backend = [] if base is None or own == base.draft_attention_backend else [f"DRAFT_ATTENTION_BACKEND={own}"]
        for k in ks:  # a drafter at a static k: a schedule the base config ships is emptied
            out.append(
                (
                    f"{label} k={k}",
                    [
                        f"SPECULATIVE_METHOD={method}",
                        f"DRAFT_MODEL_DIR={path}",
                        f"NUM_SPECULATIVE_TOKENS={k}",
                        f"{SCHEDULE_KEY}=",
                        *backend,
                    ],
                )
            )
    if opts.none:
        out.append(("no speculation", ["SPECULATIVE_METHOD=none"]))
    if opts.as_shipped:  # the config file as it is, its draft schedule included
        if not opts.none:
            raise BenchError(
                "--as-shipped is checked against the best other variant, no speculation included: add --none"
            )
        out.append((SHIPPED, []))
    if opts.ngram:
        for k in opts.ngram_k or given_k:
            out.append(
                (f"ngram k={k}", ["SPECULATIVE_METHOD=ngram", f"NUM_SPECULATIVE_TOKENS={k}", f"{SCHEDULE_KEY}="])
            )
    if not out:
        raise BenchError("nothing to compare: give --drafter, --ngram, --none or --as-shipped")
    return out


def run_ab(opts: AbOptions) -> list[Path]:
    """Serve each variant in turn and benchmark it at each concurrency; with
    `--rounds N` the whole cycle runs N times, so a machine that drifts (a shared
    CPU host does, by ~10% between sessions here) drifts under every variant, and
    `compare` averages the rounds. Even rounds run the variants in reverse order
    (A B, B A, ...): whatever a variant's place in the cycle costs (the previous
    server still exiting, a warmer page cache) falls on each variant equally.

    `--interleave` serves every variant at once instead, each on its own port, and
    runs the variants back to back at each concurrency, the order reversed from one
    concurrency to the next (A B, B A, ...) and, at each concurrency, from one round
    to the next. Two runs compared are then a run apart rather than a cycle of
    servers, so drift slower than one run cancels; it needs every variant's server
    to fit beside the others (a small model on a CPU host)."""
    if opts.rounds < 1:
        raise BenchError(f"--rounds must be at least 1, got {opts.rounds}")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(opts.serve_config, list(opts.set))
    cats = categories(opts)
    if "tools" in opts.workload and not config.tool_call_parser:
        raise BenchError(
            f"--workload tools: {opts.serve_config} sets no TOOL_CALL_PARSER, and vLLM refuses "
            "tool_choice without one (--set TOOL_CALL_PARSER=...)"
        )
    if config.runtime != "docker":  # serve's own step, run first so a --drafter it generates (the tiny pair)
        prepare(config, log=lambda m: print(f"ab: {m}", file=sys.stderr))  # exists when variants() reads it
    # each drafting server sends per-request stats, for acceptance by prompt length (none ignores it)
    metrics = (
        []
        if config.spec_decode_metrics != "none" or not spec_decode_metrics_option(config.vllm_version)
        else ["SPEC_DECODE_METRICS=summary"]
    )
    todo = [(label, sets + metrics + list(opts.set)) for label, sets in variants(opts, config)]
    rounds = [r if opts.rounds > 1 else None for r in range(1, opts.rounds + 1)]
    if opts.interleave:
        return _run_interleaved(opts, out, todo, rounds, cats)
    files: list[Path] = []
    for i, rnd in enumerate(rounds):
        for label, sets in todo if i % 2 == 0 else todo[::-1]:
            paths = _paths(opts, out, label, rnd, cats)
            missing = _missing(opts, paths)
            if missing:
                with _serving(opts, out, label, sets, rnd) as (proc, base):
                    for key in missing:
                        _bench(opts, label, rnd, sets, proc, base, *key, paths[key])
            files += paths.values()
    return files


def _run_interleaved(
    opts: AbOptions,
    out: Path,
    todo: list[tuple[str, list[str]]],
    rounds: list[int | None],
    cats: list[Category],
) -> list[Path]:
    """`--interleave`: every variant served for the whole run; at each concurrency of each
    category, every variant in turn. The order is reversed from one block to the next and, for
    the same block, from one round to the next: a place in the order favours no variant."""
    paths = {(label, rnd): _paths(opts, out, label, rnd, cats) for label, _ in todo for rnd in rounds}
    needed = [(label, sets) for label, sets in todo if any(any(_missing(opts, paths[label, r])) for r in rounds)]
    with contextlib.ExitStack() as stack:
        servers = {label: stack.enter_context(_serving(opts, out, label, sets, None)) for label, sets in needed}
        for i, rnd in enumerate(rounds):
            for j, key in enumerate([(cat, c) for cat in cats for c in opts.concurrency]):
                order = [v for v in todo if v[0] in servers and key in _missing(opts, paths[v[0], rnd])]
                for label, sets in order if (i + j) % 2 == 0 else order[::-1]:
                    _bench(opts, label, rnd, sets, *servers[label], *key, paths[label, rnd][key])
    return [p for v in paths.values() for p in v.values()]


def _paths(
    opts: AbOptions, out: Path, label: str, rnd: int | None, cats: list[Category]
) -> dict[tuple[Category, int], Path]:
    """A variant's result file for each category and concurrency of one round."""
    return {
        (cat, c): out / f"{_slug(label)}{'-' + cat.slug if cat.name else ''}-c{c}{_suffix(rnd)}.json"
        for cat in cats
        for c in opts.concurrency
    }


def _slug(label: str) -> str:
    return label.replace(" ", "-").replace("=", "")


def _suffix(rnd: int | None) -> str:
    """A round's file-name suffix; none when the run has one round."""
    return f"-r{rnd}" if rnd else ""


def _name(label: str, rnd: int | None) -> str:
    return f"{label} round {rnd}" if rnd else label


def _missing(opts: AbOptions, paths: dict[tuple[Category, int], Path]) -> list[tuple[Category, int]]:
    """What is still to run: everything, or with `--reuse` what is not on disk yet."""
    return [key for key, path in paths.items() if not (opts.reuse and path.is_file())]


def _serving(
    opts: AbOptions, out: Path, label: str, sets: list[str], rnd: int | None
) -> contextlib.AbstractContextManager[tuple[Any, str]]:
    print(f"ab: serving {_name(label, rnd)} ({' '.join(sets)})", file=sys.stderr)
    return serving_process(opts.serve_config, sets, out / f"{_slug(label)}{_suffix(rnd)}-server.log")


def _bench(
    opts: AbOptions,
    label: str,
    rnd: int | None,
    sets: list[str],
    proc: Any,
    base: str,
    cat: Category,
    c: int,
    path: Path,
) -> None:
    """One benchmark run of one variant at one concurrency in one category, written to `path`."""
    name = _name(label, rnd)
    cfg = BenchConfig(
        base_url=f"{base}/v1",
        sessions=opts.sessions,
        concurrency=c,
        turns_per_session=cat.turns,
        max_tokens=opts.max_tokens,
        temperature=opts.temperature,
        seed=opts.seed,
        prompts=cat.prompts,
        kind=cat.kind,
        category=cat.name,
        workload=cat.workload,
        warmup=opts.warmup,
        label=label,
        recipe_config=str(opts.serve_config),
        recipe_overrides=parse_overrides(sets),
        ignore_eos=opts.ignore_eos,
        server_pid=proc.pid,
        progress=True,
    )
    doc = run_benchmark(cfg)
    doc.setdefault("notes", []).append(
        f"kimidflash ab variant '{name}'" + (" (--interleave: every variant served at once)" if opts.interleave else "")
    )
    write_result(path, doc)
    print(
        f"ab: {name}{' ' + cat.name if cat.name else ''} c={c}: {doc.get('output_throughput')} "
        f"output tok/s, acceptance length {doc.get('spec_decode_acceptance_length')}",
        file=sys.stderr,
    )
    if doc.get("server_cpu"):
        cpu = doc["server_cpu"]
        print(
            "ab:   server CPU ms per output token: "
            + ", ".join(f"{r['process']} {r['ms_per_output_token']}" for r in cpu["processes"])
            + f"; host busy {cpu['host_busy_fraction']}",
            file=sys.stderr,
        )


def categories(opts: AbOptions) -> list[Category]:
    """`--category` (with `--by-kind`, `--multi-turn`), else the one unnamed category of `--prompts`;
    each once per `--workload`."""
    if opts.category:
        if opts.prompts:
            raise BenchError("give --prompts or --category, not both")
        cats = cat_mod.parse_categories(opts.category, opts.by_kind, opts.multi_turn, opts.turns, opts.kind)
    elif opts.by_kind or opts.kind or opts.multi_turn or opts.offline_category:
        raise BenchError("--by-kind, --kind, --multi-turn and --offline-category work on --category files: name one")
    else:
        cats = [Category(None, opts.prompts, None, opts.turns)]
    return cat_mod.with_workloads(cats, opts.workload)


def offline_files(specs: list[str], labels: list[str]) -> dict[str | None, Path]:
    """--offline values: `LABEL=FILE` for one drafter, a bare FILE for every drafter."""
    out: dict[str | None, Path] = {}
    for spec in specs:
        label, sep, path = spec.partition("=")
        if sep and label in labels:
            if not Path(path).is_file():
                raise BenchError(f"--offline {spec}: {path} not found")
            out[label] = Path(path)
        elif Path(spec).is_file():
            out[None] = Path(spec)
        elif sep:
            raise BenchError(f"--offline {spec}: no --drafter is labelled {label!r}, and no file is named so")
        else:
            raise BenchError(f"--offline {spec}: not found")
    return out


def offline_vs_online(files: list[Path], offline: dict[str | None, Path], out: Path) -> str:
    """A Markdown table: offline (eval phase) and online (/metrics) acceptance per k, from the files alone.
    Each drafter's rows take its own eval file (`offline[label]`), else the one for every drafter. The walk
    column (eval files since the walk was added) is the offline figure comparable with /metrics."""
    docs = {label: read_json_object(path, "offline eval file", BenchError) for label, path in offline.items()}
    lines = [
        f"Offline{'' if label is None else f' ({label})'}: `{portable(path)}` (step {docs[label].get('step')}, "
        f"{docs[label].get('split', 'heldout')} split, {docs[label].get('definition', '')})."
        for label, path in offline.items()
    ]
    lines += [
        "Online: vLLM /metrics deltas in the result files below.",
        "",
    ]
    rows = []
    for f in files:
        doc = load_result(f)
        label = doc.get("label", "")
        k = (doc.get("provenance", {}).get("recipe_config") or {}).get("values", {}).get("NUM_SPECULATIVE_TOKENS")
        off = (
            docs.get(label.split(" k=")[0], docs.get(None)) if "k=" in label and not label.startswith("ngram") else None
        )
        o = off["by_k"].get(str(k)) if off else None
        rows.append(
            [
                label,
                doc.get("max_concurrency"),
                k if doc.get("speculative") else "-",
                o["mean_acceptance_length"] if o else "-",
                (o or {}).get("walk", {}).get("mean_acceptance_length", "-"),
                doc.get("spec_decode_acceptance_length") or "-",
                o["per_position"] if o else "-",
                doc.get("spec_decode_per_position_acceptance_rates") or "-",
                doc.get("output_throughput"),
                f.name,
            ]
        )
    head = [
        "variant",
        "concurrency",
        "k",
        "offline mean acceptance length",
        "offline, as a server walks",
        "online mean acceptance length",
        "offline per position",
        "online per position",
        "output tok/s",
        "file",
    ]
    text = "\n".join(lines + table(head, rows)) + "\n"
    (out / "offline-vs-online.md").write_text(text)
    return text
