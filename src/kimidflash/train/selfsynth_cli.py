"""`kimidflash self-synth`'s command line: its options parsed, the target served, `selfsynth.py` called."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from ..background import serving_process, sigterm_as_interrupt
from ..bench.provenance import local_provenance
from ..bench.resultfile import check_output
from ..cliargs import add_config
from ..config import load_config
from ..errors import DataError
from ..fsio import read_json_object
from ..paths import cache_dir, portable
from ..prepare import prepare
from ..prompts_real.sets import bigbench_sets, humaneval_set, mtbench_set
from . import selfsynth as _domain
from .selfsynth import Settings, Template, synthesize
from .selfsynth_bench import bench_beside
from .selfsynth_text import Limits

SERVE = ["SPECULATIVE_METHOD=none", "ENABLE_PREFIX_CACHING=true"]  # every request shares the template's prefix


def eval_texts(bigbench: str | None = None, *, no_bigbench: bool = False) -> dict[str, list[str]]:
    """Every turn of the sets a drafter is judged on, by set: HumanEval, MT-bench and the held-out
    BIG-bench tasks (from `bigbench`, else the pinned archive); with `no_bigbench`, the first two
    alone, for a machine that cannot have BIG-bench's archive (the shards record which sets)."""
    sets = [humaneval_set(), mtbench_set()]
    if not no_bigbench:
        sets.append(next(s for s in bigbench_sets(bigbench) if s.name == "bigbench-heldout"))
    return {s.name: [t for r in s.records for t in r["turns"]] for s in sets}


def steering(path: Path) -> tuple[str, ...]:
    """The steering system prompts of `path` (`{"system_prompts": [...]}`), each a non-empty string."""
    doc = read_json_object(path, "--steer file", DataError)
    prompts = doc.get("system_prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(x, str) and x.strip() for x in prompts):
        raise DataError(f"{path}: `system_prompts` must be a non-empty list of non-empty strings")
    return tuple(prompts)


def template_of(model_dir: str, chat_template: str, turns: int = 1, steer: tuple[str, ...] = ()) -> Template:
    """The served chat template (CHAT_TEMPLATE, else the checkpoint's) cut at the user's content
    (and, for several turns, between turns; after each steering system prompt)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = Path(chat_template).read_text() if chat_template else None
    return Template.of(lambda m: str(tok.apply_chat_template(m, tokenize=False, chat_template=text)), turns, steer)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kimidflash self-synth", description=_domain.__doc__.splitlines()[0])
    add_config(p, "the recipe config that serves the target", set_help="override one key of the served config")
    p.add_argument("--out", type=Path, required=True, help="the shard folder (new, or one this command wrote)")
    p.add_argument("--shards", type=int, default=1, help="shards to add after those --out holds (default 1)")
    p.add_argument("--per-shard", type=int, default=256, help="requests sampled per shard (default 256)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="the user turn's sampling (default 1.0)")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--user-max-tokens", type=int, default=128)
    p.add_argument("--answer-max-tokens", type=int, default=256, help="the greedy answer's length cap")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turns", type=int, default=1, help="user turns per conversation (default 1)")
    p.add_argument(
        "--context-chars",
        type=int,
        default=0,
        help="from the second turn, other conversations' first exchanges before each, up to this many "
        "characters: long contexts the target wrote (needs --turns 2 or more; default 0)",
    )
    p.add_argument(
        "--steer",
        type=Path,
        help="a JSON file whose `system_prompts` the requests are written after, in turn (topic steering; "
        "answers are served without them); recorded in the manifest",
    )
    p.add_argument(
        "--tag", default="", help="lowercase letters in every record id (selfsynth-TAG-...): a steered folder's"
    )
    p.add_argument("--base-url", help="a target already serving (its root, without /v1); default: serve CONFIG")
    p.add_argument("--bigbench", help="a bigbench-1.0.0.tar.gz for the contamination check's held-out tasks")
    p.add_argument(
        "--no-bigbench",
        action="store_true",
        help="check contamination against HumanEval and MT-bench alone, where no BIG-bench archive can be had",
    )
    p.add_argument(
        "--bench-result",
        type=Path,
        help="then benchmark the same server at --concurrency on this run's kept requests, write the result "
        "here, and record the regen's tok/s against the server's in the manifest (`throughput`)",
    )
    a = p.parse_args(argv)
    if a.no_bigbench and a.bigbench:
        p.error("--no-bigbench and --bigbench exclude each other")
    if min(a.shards, a.per_shard, a.concurrency, a.turns) < 1:
        raise DataError("--shards, --per-shard, --concurrency and --turns must be at least 1")
    if a.context_chars < 0 or (a.context_chars and a.turns < 2):
        raise DataError(f"--context-chars {a.context_chars}: at least 0, and only with --turns 2 or more")
    if a.bench_result:
        check_output(a.bench_result, "--bench-result")  # before the shards' hours, not after them
    steer = steering(a.steer) if a.steer else ()
    config = load_config(a.config, [*SERVE, *a.set])
    settings = Settings(
        config.served_model_name,
        a.temperature,
        a.top_p,
        a.user_max_tokens,
        a.answer_max_tokens,
        a.per_shard,
        a.seed,
        Limits(),
        a.turns,
        a.context_chars,
        steer,
        a.tag,
    )
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if config.runtime != "docker":
        prepare(config, log=say)  # the model the template is read from
    template = template_of(config.model_dir, config.chat_template, a.turns, steer)
    texts = eval_texts(a.bigbench, no_bigbench=a.no_bigbench)
    provenance = {**local_provenance(["kimidflash", "self-synth", *argv]), "serve_config": portable(a.config)}
    log_dir = cache_dir() / "self-synth-logs"  # the server's log stays out of the committed folder
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack, sigterm_as_interrupt():
        base = a.base_url
        if base is None:
            _, base = stack.enter_context(serving_process(a.config, [*SERVE, *a.set], log_dir / f"{a.out.name}.log"))
        manifest = synthesize(base, a.out, template, settings, a.shards, texts, a.concurrency, provenance, say)
        if a.bench_result:
            first = len(manifest["shards"]) - a.shards
            t = bench_beside(base, a.out, manifest, first, settings, a.concurrency, a.bench_result, argv)
            say(
                f"self-synth: regen {t['regen_output_tok_s']} tok/s, the server benchmarked at "
                f"{a.concurrency} in flight {t['server_output_tok_s']} tok/s ({t['regen_vs_server']}x)"
            )
    return 0
