"""Prometheus `/metrics` parsing, before/after deltas and spec-decode math.

vLLM's counters are cumulative over the server's life, not per run, so a run's
figures are the difference of two snapshots taken around the measured window
(with nothing else talking to the server). Per-position acceptance counters
are cumulative *prefixes*: `..._num_accepted_tokens_per_pos_total{position="i"}`
counts drafts whose first i+1 tokens were all accepted. Hence:

- acceptance rate at position i      = count_i / drafts
- conditional acceptance at position i = count_i / count_{i-1} (count_{-1} = drafts)
- acceptance rate (all positions)    = accepted / draft_tokens
- mean acceptance length             = 1 + accepted / drafts (the bonus token counts)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx

from ..errors import MetricsError

LabelKey = tuple[tuple[str, str], ...]
SampleKey = tuple[str, LabelKey]

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _parse_value(raw: str) -> float:
    low = raw.lower()
    if low in ("nan",):
        return math.nan
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(raw)


def _parse_labels(body: str, line: str) -> LabelKey:
    labels: list[tuple[str, str]] = []
    pos = 0
    body = body.strip()
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if not m:
            raise MetricsError(f"bad labels in metrics line: {line!r}")
        value = re.sub(r'\\\\|\\"|\\n', lambda x: _UNESCAPE[x.group(0)], m.group(2))
        labels.append((m.group(1), value))
        pos = m.end()
    return tuple(sorted(labels))


def parse_prometheus(text: str) -> dict[SampleKey, float]:
    """All samples of an exposition text, keyed by (name, sorted labels)."""
    samples: dict[SampleKey, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise MetricsError(f"bad metrics line: {line!r}")
        try:
            value = _parse_value(m.group(4))
        except ValueError:
            raise MetricsError(f"bad value in metrics line: {line!r}") from None
        labels = _parse_labels(m.group(3), line) if m.group(3) else ()
        samples[(m.group(1), labels)] = value
    return samples


@dataclass
class Counters:
    """Counter samples keyed by (name, labels): what a scrape and a delta share."""

    counters: dict[SampleKey, float]

    def total(self, name: str) -> float | None:
        """Sum of a counter over all its label sets (engines), None if absent."""
        vals = [v for (n, _), v in self.counters.items() if n == name]
        return sum(vals) if vals else None


@dataclass
class Snapshot(Counters):
    """The cumulative counters (`*_total`) of one scrape, filtered to one model."""

    wall_time: float  # time.time() of the scrape

    @classmethod
    def from_text(cls, text: str, wall_time: float, model: str | None = None) -> Snapshot:
        counters: dict[SampleKey, float] = {}
        for (name, labels), value in parse_prometheus(text).items():
            if not name.endswith("_total"):
                continue  # gauges, histograms and `_created` timestamps are not run counters
            lab = dict(labels)
            if model is not None and "model_name" in lab and lab["model_name"] != model:
                continue
            counters[(name, labels)] = value
        return cls(counters, wall_time)


@dataclass
class Delta(Counters):
    """after - before, per counter; `reset` lists counters that went backwards."""

    seconds: float
    reset: list[str] = field(default_factory=list)

    def totals(self, prefix: str = "vllm:") -> dict[str, float]:
        """Every counter summed over label sets (engines, finish reasons, positions)."""
        out: dict[str, float] = {}
        for (name, _), v in self.counters.items():
            if name.startswith(prefix):
                out[name] = out.get(name, 0.0) + v
        return dict(sorted(out.items()))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """A counter summed per value of one label (e.g. per `position`)."""
        out: dict[str, float] = {}
        for (n, labels), v in self.counters.items():
            if n == name:
                key = dict(labels).get(label)
                if key is not None:
                    out[key] = out.get(key, 0.0) + v
        return out


def delta(before: Snapshot, after: Snapshot) -> Delta:
    """Counters that appear only after the window started from zero (vLLM creates
    labelled children lazily, e.g. a new finish reason or position)."""
    out: dict[SampleKey, float] = {}
    reset: list[str] = []
    for key, v_after in after.counters.items():
        v_before = before.counters.get(key, 0.0)
        d = v_after - v_before
        if d < 0:
            reset.append(key[0])
        out[key] = d
    return Delta(out, after.wall_time - before.wall_time, sorted(set(reset)))


def merged(deltas: Iterable[Delta]) -> Delta:
    """Several servers' windows as one (a fleet behind a router): every counter summed
    per label set, so spec_decode_stats and the token totals read the fleet as a
    single server; the window is the longest, resets are kept."""
    out: dict[SampleKey, float] = {}
    seconds, reset = 0.0, set()
    for d in deltas:
        for key, v in d.counters.items():
            out[key] = out.get(key, 0.0) + v
        seconds = max(seconds, d.seconds)
        reset.update(d.reset)
    return Delta(out, seconds, sorted(reset))


def shares(deltas: dict[str, Delta], name: str = GENERATION_TOKENS) -> dict[str, float | None]:
    """Each server's part of one counter's fleet total (None where the fleet counted none)."""
    totals = {k: d.total(name) or 0.0 for k, d in deltas.items()}
    whole = sum(totals.values())
    return {k: (v / whole if whole else None) for k, v in totals.items()}


@dataclass(frozen=True)
class SpecDecodeStats:
    """Speculative-decoding figures of one window, derived from counter deltas."""

    num_drafts: float
    draft_tokens: float
    accepted_tokens: float
    per_position_counts: tuple[float, ...]

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def acceptance_length(self) -> float | None:
        return 1.0 + self.accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def per_position_rates(self) -> list[float | None]:
        return [c / self.num_drafts if self.num_drafts else None for c in self.per_position_counts]

    @property
    def conditional_rates(self) -> list[float | None]:
        out: list[float | None] = []
        prev = self.num_drafts
        for c in self.per_position_counts:
            out.append(c / prev if prev else None)
            prev = c
        return out

    @property
    def num_speculative_tokens(self) -> int | None:
        """k as seen by the server: the number of positions it exports."""
        return len(self.per_position_counts) or None

    def combined(self, other: SpecDecodeStats) -> SpecDecodeStats:
        """Pool two windows (e.g. runs of one series at several concurrencies)."""
        n = max(len(self.per_position_counts), len(other.per_position_counts))
        a = list(self.per_position_counts) + [0.0] * (n - len(self.per_position_counts))
        b = list(other.per_position_counts) + [0.0] * (n - len(other.per_position_counts))
        return SpecDecodeStats(
            self.num_drafts + other.num_drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted_tokens + other.accepted_tokens,
            tuple(x + y for x, y in zip(a, b, strict=False)),
        )


def spec_decode_stats(d: Delta) -> SpecDecodeStats | None:
    """None when the server exports no spec-decode counters (speculation off)."""
    drafts = d.total(DRAFTS)
    if drafts is None:
        return None
    per_pos = d.by_label(ACCEPTED_PER_POS, "position")
    counts = tuple(per_pos[k] for k in sorted(per_pos, key=lambda s: int(s)))
    return SpecDecodeStats(drafts, d.total(DRAFT_TOKENS) or 0.0, d.total(ACCEPTED) or 0.0, counts)


def stats_from_counts(
    num_drafts: float, draft_tokens: float, accepted: float, per_position: Iterable[float]
) -> SpecDecodeStats:
    return SpecDecodeStats(
        float(num_drafts), float(draft_tokens), float(accepted), tuple(float(c) for c in per_position)
    )


def spec_decode_fields(s: SpecDecodeStats | None) -> dict[str, object]:
    """Result-file fields named as `vllm bench serve` names them, plus ours."""
    if s is None:
        return {
            "spec_decode_num_drafts": None,
            "spec_decode_draft_tokens": None,
            "spec_decode_accepted_tokens": None,
            "spec_decode_acceptance_rate": None,
            "spec_decode_acceptance_length": None,
            "spec_decode_per_position_acceptance_rates": None,
            "spec_decode_per_position_conditional_rates": None,
            "spec_decode_per_position_accepted_counts": None,
            "spec_decode_num_speculative_tokens": None,
        }

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 6)

    return {
        "spec_decode_num_drafts": s.num_drafts,
        "spec_decode_draft_tokens": s.draft_tokens,
        "spec_decode_accepted_tokens": s.accepted_tokens,
        "spec_decode_acceptance_rate": r(s.acceptance_rate),
        "spec_decode_acceptance_length": r(s.acceptance_length),
        "spec_decode_per_position_acceptance_rates": [r(x) for x in s.per_position_rates],
        "spec_decode_per_position_conditional_rates": [r(x) for x in s.conditional_rates],
        "spec_decode_per_position_accepted_counts": list(s.per_position_counts),
        "spec_decode_num_speculative_tokens": s.num_speculative_tokens,
    }


def server_root(base_url: str) -> str:
    """`http://h:p/v1` -> `http://h:p`: vLLM serves /metrics and /version at the root."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def metrics_url_for(base_url: str) -> str:
    """`http://h:p/v1` -> `http://h:p/metrics`."""
    return server_root(base_url) + "/metrics"


def scrape(base_url: str) -> dict[str, float]:
    """A live server's /metrics, every sample summed over its labels; per-position ones keyed `name[i]`
    (the reader of the slow tests and the fleet checks; the benchmark takes Snapshots instead)."""
    out: dict[str, float] = {}
    for (name, labels), value in parse_prometheus(httpx.get(f"{base_url}/metrics", timeout=10).text).items():
        position = dict(labels).get("position")
        key = name if position is None else f"{name}[{position}]"
        out[key] = out.get(key, 0.0) + value
    return out
