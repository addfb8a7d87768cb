"""`kimidflash self-synth`'s command line: its options parsed, the target served, `selfsynth.py` called."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from ..background import serving_process, sigterm_as_interrupt
from ..bench.provenance import local_provenance
from ..cliargs import add_config
from ..config import load_config
from ..errors import DataError
from ..paths import cache_dir, portable
from ..prepare import prepare
from ..prompts_real.sets import bigbench_sets, humaneval_set, mtbench_set
from . import selfsynth as _domain
from .selfsynth import Settings, Template, synthesize
from .selfsynth_text import Limits

SERVE = ["SPECULATIVE_METHOD=none", "ENABLE_PREFIX_CACHING=true"]  # every request shares the template's prefix


def eval_texts() -> list[str]:
    """Every turn of the sets a drafter is judged on: HumanEval, MT-bench and the held-out BIG-bench tasks."""
    sets = [humaneval_set(), mtbench_set(), next(s for s in bigbench_sets() if s.name == "bigbench-heldout")]
    return [t for s in sets for r in s.records for t in r["turns"]]


def template_of(model_dir: str, chat_template: str) -> Template:
    """The served chat template (CHAT_TEMPLATE, else the checkpoint's) cut at the user's content."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = Path(chat_template).read_text() if chat_template else None
    return Template.of(lambda m: str(tok.apply_chat_template(m, tokenize=False, chat_template=text)))


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
    p.add_argument("--base-url", help="a target already serving (its root, without /v1); default: serve CONFIG")
    a = p.parse_args(argv)
    if a.shards < 1 or a.per_shard < 1 or a.concurrency < 1:
        raise DataError("--shards, --per-shard and --concurrency must be at least 1")
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
    )
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if config.runtime != "docker":
        prepare(config, log=say)  # the model the template is read from
    template = template_of(config.model_dir, config.chat_template)
    texts = eval_texts()
    provenance = {**local_provenance(["kimidflash", "self-synth", *argv]), "serve_config": portable(a.config)}
    log_dir = cache_dir() / "self-synth-logs"  # the server's log stays out of the committed folder
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack, sigterm_as_interrupt():
        base = a.base_url
        if base is None:
            _, base = stack.enter_context(serving_process(a.config, [*SERVE, *a.set], log_dir / f"{a.out.name}.log"))
        synthesize(base, a.out, template, settings, a.shards, texts, a.concurrency, provenance, say)
    return 0
