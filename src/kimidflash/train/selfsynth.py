"""Conversations the target writes itself, in committed shards that later sessions extend.

Magpie's recipe (Xu et al., 2024): an aligned model given only its chat template's user prefix
writes a user request. The served target samples that request through `/v1/completions` on the
rendered prefix (temperature and top-p from the settings, one seed per request, stopped at the
template's end-of-turn marker), then answers it greedily through `/v1/chat/completions`, as
serving verifies, with the token ids it saw and wrote (`return_token_ids`): the answer is a regen
record, so a training run reads the shards as its `regen.jsonl`. Requests are filtered
(`text.refusal`, near duplicates across every shard so far, the evaluation sets' 13-grams) before
they are answered; answers caught in a repetition loop are dropped.

With `turns` above 1, each answered conversation goes on: the target writes the next user turn
after the conversation so far (the template's text between turns, `Template.continued`), and
answers it greedily with the whole history, so each later turn is a record whose prompt holds every
earlier one. A later turn is filtered as a first one is, but for near duplicates (its context makes
its record differ), and a refused one ends its conversation; its refusals are named by turn.

Long contexts: most sessions end at a refused turn long before their history is long (a 135M target
loops often), so `context_chars` puts other conversations of the shard before each one from its
second turn on: their first exchanges, whole, in an order drawn by sha256 of the seed, the shard and
the pair, until the next would pass `context_chars` characters. Every later turn is then written
and answered after a long history the target wrote itself. Those exchanges are context (loss 0) in
the records they precede, so a conversation held out from training appears in trained records only as
text before an answer, never as one.

Topic steering (Magpie's task-specific system prompts): with `Settings.steer`, request i of a shard is
written after the template's system turn holding steering prompt i mod n instead of the default, so
the target writes requests of that kind (code, maths, editing, ...); it is still answered through
`/v1/chat/completions` with the user turn alone, as a user's request is served. The steering prompts
are in the manifest's settings; a steered folder's ids carry `Settings.tag`, so its records and an
unsteered folder's can train in one run.

A shard is written whole (gzip, then an atomic rename), and the manifest after it, so an
interrupted run loses at most the shard in flight and the next run starts at the next index.
Shard k's seeds are fixed by k, so a shard written again is the same shard.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..drawn import drawn, leading_within
from ..errors import DataError, RegenError
from ..fsio import read_json_object, sha256_file, utc_now, write_json_atomic
from .data import ID_TAG, Record, make_record, read_shard, synthetic_prompts
from .data import SHARDS_MANIFEST as MANIFEST
from .selfsynth_text import Contamination, Diversity, Limits, NearDuplicates, refusal, repeat_share, words

SENTINEL = "\u2063KIMIDFLASH-USER-TURN\u2063"
SOURCE = "selfsynth"
DIVERSITY_SAMPLE = 10_000


@dataclass(frozen=True)
class Template:
    """The chat template cut at the user's content: what the target is given, and where its turn ends.
    For later turns, what the template puts between a user's content and the reply (`reply`) and
    between a reply and the next user's content (`next_user`); empty for one-turn shards."""

    prefix: str
    stop: str
    reply: str = ""
    next_user: str = ""
    steered: tuple[str, ...] = ()  # the user prefix after each steering system prompt (Settings.steer)

    @classmethod
    def of(cls, render: Callable[[list[dict[str, str]]], str], turns: int = 1, steer: Sequence[str] = ()) -> Template:
        """`render(messages)` is the chat template applied as text without a generation prompt."""
        text = render([{"role": "user", "content": SENTINEL}])
        if text.count(SENTINEL) != 1:
            raise DataError("the chat template does not place a user message's content once: no user prefix")
        prefix, suffix = text.split(SENTINEL)
        stop = suffix.strip().split("\n")[0].strip() or suffix
        if not stop:
            raise DataError("the chat template ends a user turn with nothing: no end-of-turn marker to stop at")
        steered = tuple(cls._after_system(render, system) for system in steer)
        if turns == 1:
            return cls(prefix, stop, steered=steered)
        marks = [f"{SENTINEL}{n}{SENTINEL}" for n in range(3)]
        roles = ("user", "assistant", "user")
        text = render([{"role": r, "content": m} for r, m in zip(roles, marks, strict=True)])
        head, *pieces = text.split(SENTINEL)
        if head != prefix or len(pieces) != 6 or pieces[0::2] != ["0", "1", "2"]:
            raise DataError("the chat template does not render a second user turn after the first and a reply")
        return cls(prefix, stop, pieces[1], pieces[3], steered)

    @staticmethod
    def _after_system(render: Callable[[list[dict[str, str]]], str], system: str) -> str:
        text = render([{"role": "system", "content": system}, {"role": "user", "content": SENTINEL}])
        if text.count(SENTINEL) != 1 or system not in text.split(SENTINEL)[0]:
            raise DataError(f"the chat template does not place a system prompt before the user turn: {system[:60]!r}")
        return text.split(SENTINEL)[0]

    def first(self, i: int) -> str:
        """What request `i` of a shard is written after: the user prefix, steered by prompt i mod n if any."""
        return self.steered[i % len(self.steered)] if self.steered else self.prefix

    def continued(self, messages: Sequence[str]) -> str:
        """The prefix for the next user turn after `messages` (user, reply, user, reply, ...)."""
        if not self.next_user or len(messages) % 2:
            raise DataError("a later turn needs a template made for several turns and whole exchanges")
        return self.prefix + "".join(
            u + self.reply + a + self.next_user for u, a in zip(messages[0::2], messages[1::2], strict=True)
        )


@dataclass(frozen=True)
class Settings:
    """What a shard is made with; the manifest records it, and a run with other settings is refused."""

    model: str
    temperature: float = 1.0
    top_p: float = 0.95
    user_max_tokens: int = 128
    answer_max_tokens: int = 256
    per_shard: int = 256  # requests sampled per shard (kept: fewer, after the filters)
    seed: int = 0
    limits: Limits = field(default_factory=Limits)
    turns: int = 1  # user turns per conversation: each later one written and answered after the last
    context_chars: int = 0  # from turn 2: other conversations' first exchanges before each, up to this
    steer: tuple[str, ...] = ()  # system prompts the requests are written after, in turn (not answered with)
    tag: str = ""  # in every record id after the source (selfsynth-TAG-00003-0017): a steered folder's ids

    def __post_init__(self) -> None:
        if self.tag and not re.fullmatch(ID_TAG, self.tag):
            raise DataError(f"self-synthesis tag {self.tag!r}: lowercase letters only (it is part of every record id)")


@dataclass
class ShardResult:
    records: list[Record]
    users: list[str]
    refused: Counter[str]
    contaminated: int
    generated_tokens: int
    seconds: float
    first_turns: list[int] = field(default_factory=list)  # the session index of each kept first turn


async def _sample(client: httpx.AsyncClient, body: dict[str, Any], path: str) -> dict[str, Any]:
    r = await client.post(path, json=body)
    if r.status_code != 200:
        raise RegenError(f"{path}: HTTP {r.status_code}: {r.text[:300]}")
    return r.json()


def padding(firsts: Mapping[int, list[str]], i: int, budget: int, salt: str) -> list[str]:
    """The history put before session `i` from its second turn (`Settings.context_chars`): other
    sessions' first exchanges (user, reply), whole, in sha256(salt:i:j) order, while the texts stay
    within `budget` characters."""
    order = drawn((j for j in firsts if j != i), lambda j: f"{i}:{j}", salt)
    picked = leading_within(order, lambda j: sum(len(t) for t in firsts[j]), budget)
    return [text for j in picked for text in firsts[j]]


def _reason(why: str, turn: int) -> str:
    """A refusal's name in the manifest: a later turn's carries its number (`turn2_language`)."""
    return why if turn == 1 else f"turn{turn}_{why}"


async def _shard(
    base_url: str, template: Template, s: Settings, k: int, near: NearDuplicates, contam: Contamination, conc: int
) -> ShardResult:
    sem = asyncio.Semaphore(conc)
    refused: Counter[str] = Counter()
    contaminated = generated = 0
    t0 = time.monotonic()
    # A request can wait behind every other one's prefill: at 64 in flight with long contexts on a CPU
    # (a few hundred prompt tokens a second) that is more than ten minutes
    async with httpx.AsyncClient(base_url=base_url, timeout=3600) as client:

        async def user(prompt: str, seed: int) -> tuple[str, int]:
            async with sem:
                js = await _sample(
                    client,
                    {
                        "model": s.model,
                        "prompt": prompt,
                        "max_tokens": s.user_max_tokens,
                        "temperature": s.temperature,
                        "top_p": s.top_p,
                        "seed": seed,
                        "stop": [template.stop],
                    },
                    "/v1/completions",
                )
            choice = js["choices"][0]
            text = choice["text"].strip() if choice.get("finish_reason") == "stop" else ""
            return text, js.get("usage", {}).get("completion_tokens", 0)

        async def answer(rid: str, history: list[str], turn: int) -> tuple[Record, str] | None:
            roles = ("user", "assistant")
            messages = [{"role": roles[n % 2], "content": m} for n, m in enumerate(history)]
            async with sem:
                js = await _sample(
                    client,
                    {
                        "model": s.model,
                        "messages": messages,
                        "max_tokens": s.answer_max_tokens,
                        "temperature": 0.0,
                        "return_token_ids": True,
                    },
                    "/v1/chat/completions",
                )
            choice = js["choices"][0]
            out = choice.get("token_ids")
            if out is None or js.get("prompt_token_ids") is None:
                raise RegenError("the server returned no token ids: it must support return_token_ids (vLLM >= 0.10)")
            reply = choice["message"]["content"] or ""
            nonlocal generated
            generated += len(out)  # kept or refused, the server generated it: the rate counts it
            if repeat_share(words(reply)) > s.limits.max_repeat:
                refused[_reason("answer_repetition", turn)] += 1
                return None
            return make_record(rid, history[-1], js["prompt_token_ids"], out, choice["finish_reason"]), reply

        records: list[Record] = []
        first_turns: list[int] = []
        sessions: list[tuple[int, list[str]]] = [(i, []) for i in range(s.per_shard)]
        tasks: list[asyncio.Task[Any]] = []  # cancelled on the way out, so an error leaves none running
        try:
            for turn in range(1, s.turns + 1):
                if turn == 2 and s.context_chars:
                    firsts = dict(sessions)
                    salt = f"{s.seed}:{k}"
                    sessions = [(i, [*padding(firsts, i, s.context_chars, salt), *h]) for i, h in sessions]
                # turn 1 from the template's user prefix; later ones after the conversation so far
                prompts = [template.first(i) if turn == 1 else template.continued(h) for i, h in sessions]
                seeds = [s.seed * 1_000_003 + k * s.per_shard + i + (turn - 1) * 100_000_000 for i, _ in sessions]
                sampled = [asyncio.create_task(user(p, seed)) for p, seed in zip(prompts, seeds, strict=True)]
                tasks += sampled
                rid = f"{SOURCE}{'-' + s.tag if s.tag else ''}-{k:05d}-{{:04d}}" + ("" if turn == 1 else f"-t{turn}")
                kept: list[tuple[int, list[str]]] = []
                answering: list[asyncio.Task[tuple[Record, str] | None]] = []
                # Filtered in seed order, so a shard is reproducible; each kept request is answered as soon
                # as it and every earlier one are in, while later requests are still being written: the
                # server is not left to drain between the two phases.
                for (i, history), task in zip(sessions, sampled, strict=True):
                    text, n = await task
                    generated += n
                    why = "cut_at_max_tokens" if not text else refusal(text, s.limits)
                    if why is None and contam.hits(text):
                        why, contaminated = "contaminated", contaminated + 1
                    if turn == 1:  # a later turn's record differs by its context even where its words repeat
                        why = why or near.check(text)
                    if why:
                        refused[_reason(why, turn)] += 1
                    else:
                        kept.append((i, [*history, text]))
                        answering.append(asyncio.create_task(answer(rid.format(i), kept[-1][1], turn)))
                        tasks.append(answering[-1])
                answered = await asyncio.gather(*answering)
                sessions = []
                for (i, history), got in zip(kept, answered, strict=True):
                    if got is not None:
                        records.append(got[0])
                        if turn == 1:
                            first_turns.append(i)
                        sessions.append((i, [*history, got[1]]))
        finally:
            for t in tasks:
                t.cancel()
    took = time.monotonic() - t0
    return ShardResult(records, [r.prompt for r in records], refused, contaminated, generated, took, first_turns)


def shard_path(out: Path, k: int) -> Path:
    return out / f"shard-{k:05d}.jsonl.gz"


# Fields added after a folder was first written, at the values that folder was made with: a
# manifest that lacks them was written with these, so it is not refused for lacking them.
ADDED_DEFAULTS: dict[str, Any] = {
    "turns": 1,
    "context_chars": 0,
    "reply": "",
    "next_user": "",
    "steer": [],
    "tag": "",
    "steered": [],
}


def _lean(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if not (k in ADDED_DEFAULTS and ADDED_DEFAULTS[k] == v)}


def load_manifest(out: Path, settings: Settings, template: Template) -> dict[str, Any]:
    """The run's manifest, new or as it is; another model, template or settings is refused by name."""
    path = out / MANIFEST
    # through JSON, as the manifest holds it: a tuple of steering prompts reads back as a list
    want = json.loads(json.dumps({"source": SOURCE, "settings": asdict(settings), "template": asdict(template)}))
    if not path.is_file():
        return {**want, "shards": []}
    doc = read_json_object(path, "self-synthesis manifest", DataError)
    for key in ("source", "settings", "template"):
        if _lean(doc.get(key)) != _lean(want[key]):
            raise DataError(
                f"{path}: its {key} differ from this run's ({json.dumps(doc.get(key))[:200]} against "
                f"{json.dumps(want[key])[:200]}): give another --out, or the same settings"
            )
    return doc


def synthesize(
    base_url: str,
    out: Path,
    template: Template,
    settings: Settings,
    shards: int,
    eval_texts: Mapping[str, Sequence[str]],
    concurrency: int = 32,
    provenance: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write `shards` more shards after those `out` holds; return the manifest. `eval_texts`: the
    texts of each evaluation set (by name) no request or answer may share a long n-gram with; each
    shard records the sets it was checked against, since a machine may lack one (BIG-bench's)."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(out, settings, template)
    near, contam = NearDuplicates(), Contamination([t for texts in eval_texts.values() for t in texts])
    checked = {name: len(texts) for name, texts in eval_texts.items()}
    users = []
    for entry in manifest["shards"]:  # every request kept so far, so no later shard repeats one
        for rec in read_shard(out / entry["file"]):
            near.check(rec.prompt)
            users.append(rec.prompt)
    start = len(manifest["shards"])
    for k in range(start, start + shards):
        res = asyncio.run(_shard(base_url, template, settings, k, near, contam, concurrency))
        path = shard_path(out, k)
        tmp = path.with_name(path.name + ".tmp")
        with gzip.open(tmp, "wt") as f:
            f.write("".join(json.dumps(asdict(r), separators=(",", ":")) + "\n" for r in res.records))
        tmp.replace(path)
        users += res.users
        manifest["shards"].append(
            {
                "file": path.name,
                "sha256": sha256_file(path),
                "requested": settings.per_shard,
                "kept": len(res.records),
                "refused": dict(sorted(res.refused.items())),
                "contaminated": res.contaminated,
                "checked_against": checked,
                "response_tokens": sum(r.n_response for r in res.records),
                "generated_tokens": res.generated_tokens,
                "seconds": round(res.seconds, 3),  # ms: a shard of a fast server can take under 0.05 s
                "output_tok_s": round(res.generated_tokens / res.seconds, 1) if res.seconds else None,
                "written": utc_now(),
                # topic spread under steering: kept first turns by the steering prompt they were written after
                **({"kept_by_steer": kept_by_steer(res.first_turns, len(settings.steer))} if settings.steer else {}),
                **({"provenance": provenance} if provenance else {}),
            }
        )
        manifest["totals"] = totals(manifest["shards"])
        manifest["contamination"] = {
            "ngram": contam.n,
            "eval_texts": contam.sources,
            "sets": checked,  # this run's; each shard's own is its checked_against
            "refused": manifest["totals"]["contaminated"],
        }
        n = min(len(users), DIVERSITY_SAMPLE)  # distinct-n falls as a set grows: compare equal counts
        manifest["diversity"] = {
            "sample": n,
            "kept": asdict(Diversity.of(users[:n])),
            "synthetic_templates": asdict(Diversity.of([q["prompt"] for q in synthetic_prompts(n, 0)])),
        }
        write_json_atomic(out / MANIFEST, manifest)
        log(
            f"self-synth: shard {k}: kept {len(res.records)} "
            + (f"of {settings.per_shard} " if settings.turns == 1 else f"turns of {settings.per_shard} sessions ")
            + f"({', '.join(f'{n} {w}' for w, n in sorted(res.refused.items())) or 'none refused'}), "
            f"{res.generated_tokens / max(res.seconds, 1e-9):.0f} tok/s"
        )
    return manifest


def kept_by_steer(first_turns: Sequence[int], n: int) -> list[int]:
    """How many kept first turns each of `n` steering prompts wrote (session i was written after i mod n)."""
    counts = Counter(i % n for i in first_turns)
    return [counts[j] for j in range(n)]


def totals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    refused: Counter[str] = Counter()
    for e in entries:
        refused.update(e["refused"])
    spread = [e["kept_by_steer"] for e in entries if "kept_by_steer" in e]
    return {
        "shards": len(entries),
        "requested": sum(e["requested"] for e in entries),
        "kept": sum(e["kept"] for e in entries),
        "response_tokens": sum(e["response_tokens"] for e in entries),
        "contaminated": sum(e["contaminated"] for e in entries),
        **({"kept_by_steer": [sum(c) for c in zip(*spread, strict=True)]} if spread else {}),
        "refused": dict(sorted(refused.items())),
    }
