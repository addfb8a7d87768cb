"""Where the user turns of each session come from.

Three sources: the built-in diverse set shipped in `data/prompts.jsonl`
(reasoning, math, code, summarisation, chit-chat, multi-turn conversations),
a JSONL file, or a ShareGPT-style conversation file. A JSONL line may be in
any of the formats operators already keep their traffic in: the benchmark's
own (`prompt` or `turns`), a chat-completion request body (`messages`, text
or content parts), an OpenAI Batch API input line (`custom_id`, `url`,
`body`), or a ShareGPT conversation; a bad line is named by its number. Only *user* turns are
taken from a source: assistant turns are whatever the server answers, so the
history a session sends is the server's own (that is what a real chat does,
and what makes later turns' prompt lengths realistic).
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import PromptError
from ..fsio import write_text_atomic

BUILTIN = "builtin"
FORMATS = ("auto", "jsonl", "sharegpt")

# Used when a session has more turns than its conversation: plain follow-ups
# that make sense after any answer.
GENERIC_FOLLOW_UPS: tuple[str, ...] = (
    "Can you go into more detail on the most important point?",
    "Summarise your answer in three bullet points.",
    "What is a common mistake people make here, and how do I avoid it?",
    "Give me a concrete example.",
    "Explain that again as if I were new to the subject.",
    "What would change if the situation were reversed?",
    "Which part of your answer are you least sure about, and why?",
    "Turn that into a short checklist.",
)


@dataclass(frozen=True)
class Conversation:
    id: str
    kind: str
    turns: tuple[str, ...]  # user messages, in order


# OpenAI Batch API input lines the benchmark replays: their `url` and its request body's prompt key.
BATCH_URLS = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}


def _text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of an OpenAI content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(t for t in parts if isinstance(t, str)) or None
    return None


def _batch_body(obj: dict[str, Any], where: str) -> dict[str, Any]:
    """The request body of an OpenAI Batch API input line (`custom_id`, `method`, `url`, `body`), checked
    to be a request the benchmark can replay; its id and category carried onto it."""
    url, body = obj.get("url"), obj.get("body")
    if url not in BATCH_URLS:
        raise PromptError(
            f"{where}: a Batch API line for {url!r}; the benchmark replays {' and '.join(BATCH_URLS)} requests"
        )
    if not isinstance(body, dict) or BATCH_URLS[url] not in body:
        raise PromptError(f"{where}: a Batch API line for {url} whose body has no {BATCH_URLS[url]!r}")
    meta = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
    kind = obj.get("kind", obj.get("category", meta.get("category", "unknown")))
    return {**body, "id": obj.get("custom_id", body.get("id")), "kind": kind}


def _from_obj(obj: Any, where: str, idx: int) -> Conversation:
    """One record in any of the accepted shapes: the benchmark's own (`turns` or `prompt`), a
    chat-completion request body (`messages`), an OpenAI Batch API input line (its `body`), or a
    ShareGPT conversation (`conversations`). Only user turns are kept: the server writes the rest."""
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "custom_id" in obj and "body" in obj:
        obj = _batch_body(obj, where)
    cid = str(obj["id"] if obj.get("id") is not None else idx)
    kind = str(obj.get("kind", obj.get("category", "unknown")))
    turns: list[str]
    if "turns" in obj:
        turns = [t for t in obj["turns"] if isinstance(t, str)]
    elif "prompt" in obj:
        turns = [obj["prompt"]] if isinstance(obj["prompt"], str) else []
    elif "messages" in obj:
        msgs = obj["messages"] if isinstance(obj["messages"], list) else []
        turns = [
            t
            for m in msgs
            if isinstance(m, dict) and m.get("role") == "user" and (t := _text(m.get("content"))) is not None
        ]
    elif "conversations" in obj or "conversation" in obj:
        conv = obj.get("conversations", obj.get("conversation"))
        turns = []
        for m in conv if isinstance(conv, list) else []:
            if not isinstance(m, dict):
                continue
            who = m.get("from", m.get("role"))
            text = _text(m.get("value", m.get("content")))
            if who in ("human", "user") and text is not None:
                turns.append(text)
    else:
        raise PromptError(
            f"{where}: no 'turns', 'prompt', 'messages' or 'conversations' key (nor a Batch API "
            "line's 'custom_id' and 'body')"
        )
    turns = [t for t in turns if t.strip()]
    if not turns:
        raise PromptError(f"{where}: record has no non-empty user turn")
    return Conversation(cid, kind, tuple(turns))


def parse_jsonl(text: str, name: str) -> list[Conversation]:
    out: list[Conversation] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptError(f"{name}:{n}: not JSON ({e.msg})") from None
        out.append(_from_obj(obj, f"{name}:{n}", len(out)))
    return out


def parse_sharegpt(text: str, name: str) -> list[Conversation]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PromptError(f"{name}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, list):
        raise PromptError(f"{name}: a ShareGPT file is a JSON array of conversations")
    out: list[Conversation] = []
    for i, obj in enumerate(data):
        with contextlib.suppress(PromptError):  # ShareGPT dumps hold empty or assistant-only records: skipped
            out.append(_from_obj(obj, f"{name}[{i}]", i))
    if not out:
        raise PromptError(f"{name}: no conversation with a user turn")
    return out


def load_file(path: str | Path, fmt: str = "auto") -> list[Conversation]:
    p = Path(path)
    if fmt not in FORMATS:
        raise PromptError(f"unknown prompt format {fmt!r} (choose from {', '.join(FORMATS)})")
    if not p.is_file():
        raise PromptError(f"prompts file not found: {p}")
    text = p.read_text(encoding="utf-8")
    if fmt == "auto":
        fmt = "sharegpt" if text.lstrip().startswith("[") else "jsonl"
    convs = parse_sharegpt(text, str(p)) if fmt == "sharegpt" else parse_jsonl(text, str(p))
    if not convs:
        raise PromptError(f"{p}: no prompts")
    return convs


def load_builtin() -> list[Conversation]:
    text = resources.files("kimidflash.bench").joinpath("data/prompts.jsonl").read_text(encoding="utf-8")
    return parse_jsonl(text, "builtin prompts")


def load_source(source: str | None) -> list[Conversation]:
    """`None` or "builtin" for the shipped set, else a file path (format sniffed)."""
    if source in (None, "", BUILTIN):
        return load_builtin()
    return load_file(source)


def session_turns(
    convs: list[Conversation], sessions: int, turns: int, seed: int, reserve: int = 0
) -> tuple[list[list[str]], list[str]]:
    """User turns for each session, plus `reserve` warm-up prompts kept apart.

    Conversations are shuffled with `seed` and dealt round-robin (so two runs
    with one seed send the same prompts); a session longer than its
    conversation continues with generic follow-ups. Warm-up prompts come from
    the end of the shuffled order and are not reused while there are enough.
    """
    if not convs:
        raise PromptError("no prompts")
    order = list(convs)
    random.Random(seed).shuffle(order)
    warm: list[str] = []
    pool = order
    if reserve:
        spare = len(order) - sessions
        take = min(reserve, max(spare, 0))
        warm = [c.turns[0] for c in order[len(order) - take :]] if take else []
        pool = order[: len(order) - take] if take else order
        while len(warm) < reserve:
            warm.append(order[len(warm) % len(order)].turns[0])
    rng = random.Random(seed + 1)
    out: list[list[str]] = []
    for s in range(sessions):
        conv = pool[s % len(pool)]
        ts = list(conv.turns[:turns])
        while len(ts) < turns:
            ts.append(GENERIC_FOLLOW_UPS[rng.randrange(len(GENERIC_FOLLOW_UPS))])
        out.append(ts)
    return out, warm


def of_kind(convs: list[Conversation], kind: str | None) -> list[Conversation]:
    """The conversations of one kind (all of them for None); a kind the source lacks names those it has."""
    if kind is None:
        return convs
    out = [c for c in convs if c.kind == kind]
    if not out:
        raise PromptError(f"no prompts of kind {kind!r}; the source has {', '.join(kinds(convs)) or 'none'}")
    return out


def kinds(convs: Iterable[Conversation]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in convs:
        out[c.kind] = out.get(c.kind, 0) + 1
    return dict(sorted(out.items()))


def export_jsonl(path: str | Path, sessions: int, seed: int, warmup: int = 0, source: str | None = None) -> int:
    """Write the first turns a run with these settings sends, one `{"prompt": ...}`
    per line: `vllm bench serve --dataset-name custom --dataset-path PATH` then
    sends the same prompts (the peer cross-check). Returns the number written."""
    convs = load_source(source)
    turns, _ = session_turns(convs, sessions, 1, seed, reserve=warmup)
    write_text_atomic(path, "".join(json.dumps({"prompt": t[0]}, ensure_ascii=False) + "\n" for t in turns))
    return len(turns)
