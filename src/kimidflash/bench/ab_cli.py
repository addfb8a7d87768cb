"""`kimidflash ab`'s command line: its options parsed and checked, then `ab.py` called."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..background import sigterm_as_interrupt
from ..cliargs import add_set, options
from ..errors import EXIT_INTERRUPTED
from . import ab as _domain
from . import categories as cat_mod
from .ab import DEFAULT_K, drafter_spec, offline_files, offline_vs_online, run_ab
from .ab_options import AbOptions
from .report import compare
from .resultfile import load_result
from .shipped import checked, own_statics, shipped_check, write_shipped_check
from .workloads import WORKLOADS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kimidflash ab", description=_domain.__doc__.splitlines()[0])
    p.add_argument("serve_config", type=Path)
    p.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="a draft checkpoint to serve (repeatable): a DFlash drafter or an EAGLE-3 head, the method "
        "read from its config.json, so one run compares both families",
    )
    p.add_argument("--ngram", action="store_true")
    p.add_argument("--none", action="store_true", help="include the no-speculation baseline")
    p.add_argument(
        "--as-shipped",
        action="store_true",
        help="include the config as it is (its draft schedule too), checked against the best other "
        "variant per concurrency in shipped-check.md (with --none)",
    )
    p.add_argument("--ngram-k", type=int, nargs="+", help="num_speculative_tokens for ngram (default: --k)")
    p.add_argument(
        "--k",
        type=int,
        nargs="+",
        help=f"num_speculative_tokens values for --drafter and --ngram (default {DEFAULT_K[0]}; each "
        "drafter runs those its block size serves)",
    )
    p.add_argument(
        "--prompts",
        default=None,
        help="builtin (default), or your traffic: a JSONL of the benchmark's prompts, chat-completion "
        "request bodies or OpenAI Batch API input lines, or ShareGPT conversations (a JSON array "
        "or one per line)",
    )
    p.add_argument(
        "--category",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="benchmark this prompt file as its own category (repeatable; instead of --prompts): "
        "specbench.md then gives acceptance and speedup per category",
    )
    p.add_argument(
        "--by-kind",
        action="store_true",
        help="split each --category file whose records carry several kinds into NAME/kind categories",
    )
    p.add_argument(
        "--kind",
        action="append",
        default=[],
        help="with --by-kind, run only this kind (repeatable)",
    )
    p.add_argument(
        "--multi-turn",
        action="append",
        default=[],
        metavar="NAME=N",
        help="also run --category NAME's sessions for N turns, as the category 'NAME multi-turn'",
    )
    p.add_argument(
        "--workload",
        nargs="+",
        default=["free"],
        choices=list(WORKLOADS),
        help="what requests ask for besides their messages; several: each category once per workload, "
        "in specbench.md as 'CATEGORY WORKLOAD' rows (tools needs the server's TOOL_CALL_PARSER)",
    )
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=1)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    add_set(p, "extra serve override")
    p.add_argument("--reuse", action="store_true", help="skip variants whose result files exist (resume)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="cycle through all variants this many times (files get -rN); compare averages the rounds",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="serve every variant at once, each on its own port, and run them back to back at each "
        "concurrency (order reversed each time): drift slower than one run cancels; every "
        "variant's server must fit beside the others",
    )
    p.add_argument("--out", required=True, help="folder for result files, report.md and charts")
    p.add_argument(
        "--offline",
        action="append",
        default=[],
        metavar="[LABEL=]FILE",
        help="an eval.json / offline-acceptance.json to set beside online figures: LABEL=FILE for "
        "that --drafter's rows, FILE for every drafter (repeatable)",
    )
    p.add_argument(
        "--offline-category",
        action="append",
        default=[],
        metavar="LABEL@CATEGORY=FILE",
        help="an eval.json whose walk acceptance length goes beside --drafter LABEL's row of "
        "CATEGORY in specbench.md (repeatable)",
    )
    opts = options(AbOptions, p.parse_args(argv))
    offline = offline_files(opts.offline, [d.partition("=")[0] for d in opts.drafter])
    walks = cat_mod.offline_walks(opts.offline_category)
    try:
        with sigterm_as_interrupt():  # else a Ctrl-C inside a benchmark run finishes that run as a result
            files = run_ab(opts)
    except KeyboardInterrupt:
        print(
            f"ab: interrupted; finished result files are kept in {opts.out}: rerun with --reuse to serve only "
            "what is missing",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    base = "no speculation" if opts.none else None
    named = bool(opts.category) or opts.workload != ["free"]  # named categories: a report each, and specbench.md
    table = cat_mod.specbench(files, base, walks) if base is not None and (named or opts.as_shipped) else None
    if named:
        per_cat: dict[str, list[str]] = {}
        for f in files:
            per_cat.setdefault(load_result(f)["config"]["category"], []).append(str(f))
        for name, group in per_cat.items():
            compare(group, baseline=base, markdown=Path(opts.out) / f"report-{cat_mod.slug(name)}.md", terminal=False)
        if table is not None:
            print(cat_mod.write(table, Path(opts.out)))
    else:
        compare(
            [str(f) for f in files],
            baseline=base,
            markdown=Path(opts.out) / "report.md",
            charts=Path(opts.out) / "charts",
        )
    if opts.as_shipped and table is not None:
        check = shipped_check(
            table, own_statics(table["series"], [drafter_spec(d) for d in opts.drafter], opts.serve_config, opts.set)
        )
        check["checked_schedule"] = checked(check, opts.serve_config, opts.set)
        print(write_shipped_check(check, Path(opts.out), opts.serve_config))
    if offline:
        print(offline_vs_online(files, offline, Path(opts.out)))
    return 0
