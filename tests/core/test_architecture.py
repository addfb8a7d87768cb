"""The package's shape: no import cycle, internal imports at the top.

Read with `ast`, not by importing, so a cycle that only bites on one call
path (an import inside a function, or under TYPE_CHECKING) still counts: such
an import is how a cycle gets dodged instead of fixed. Importing `a.b.c` runs
the `__init__` of `a` and `a.b` first, so those count as edges too, except a
module's own enclosing packages (already being imported when it runs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "kimidflash"
# Third-party imports that may wait inside a function: heavy, and needed by few commands
# (jsonschema: only the benchmark's reply checks need it, and GPU training nodes lack it).
DEFERRABLE = {
    "torch",
    "transformers",
    "tokenizers",
    "docker",
    "matplotlib",
    "safetensors",
    "numpy",
    "vllm",
    "huggingface_hub",
    "jsonschema",
}


def modules(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``src``."""
    found = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_package(name: str, known: dict[str, Path]) -> bool:
    return name in known and known[name].name == "__init__.py"


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, ast.AST, bool]]:
    """(imported module, node, at top level?) for every import in ``path``; package-internal
    names are resolved to the deepest module they name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = name if _is_package(name, known) else name.rpartition(".")[0]
    top = set(map(id, tree.body))
    found: list[tuple[str, ast.AST, bool]] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
        for t in targets:
            if t == PACKAGE or t.startswith(PACKAGE + "."):
                while t not in known:  # `from a.b import func`: the module a.b
                    t = t.rpartition(".")[0]
            found.append((t, node, id(node) in top))
    return found


def graph(known: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target, _, _ in imports(name, path, known):
            if target not in known:
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                step = ".".join(parts[:i])
                if step in known and step not in own and step != name:
                    edges[name].add(step)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    scc.append(m)
                    if m == node:
                        break
                if len(scc) > 1:
                    out.append(sorted(scc))
    return out


def test_the_cycle_finder_sees_a_cycle_dodged_by_a_function_level_import(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (pkg / "c.py").write_text("from . import a\nfrom .sub.b import f\n")
    known = modules(tmp_path)
    assert cycles(graph(known)) == [["kimidflash.a", "kimidflash.sub.b"]]
    late = [(n, t) for n in known for t, _, top in imports(n, known[n], known) if not top]
    assert late == [("kimidflash.sub.b", "kimidflash.a")]


def test_no_import_cycle_between_the_packages_modules():
    found = cycles(graph(modules()))
    assert not found, "import cycles (move the shared piece into a leaf module): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_imports_sit_at_the_top_of_their_module_but_the_heavy_optional_ones():
    known = modules()
    late = [
        f"{known[name].relative_to(SRC)}:{node.lineno} imports {target}"
        for name in known
        for target, node, at_top in imports(name, known[name], known)
        if not at_top and target.partition(".")[0] not in DEFERRABLE
    ]
    assert not late, "imports inside functions or blocks (a dodged cycle?):\n" + "\n".join(late)


def test_only_the_in_image_check_runs_as_a_script():
    """Commands go through `python -m kimidflash`; imagecheck.py runs by path inside the image."""
    scripts = sorted(
        str(p.relative_to(SRC)) for p in modules().values() if 'if __name__ == "__main__"' in p.read_text()
    )
    assert scripts == ["kimidflash/docker/imagecheck.py"], scripts


# ------------------------------------------------------------------ layers
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def layers(text: str) -> dict[str, int]:
    """Part -> layer number, from the first ```text block under `## Layers` (`N name: part part ...`)."""
    section = text.split("\n## Layers\n", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    out: dict[str, int] = {}
    for line in block.strip().splitlines():
        number, _, rest = line.partition(" ")
        for part in rest.partition(":")[2].split():
            assert part not in out, f"{part} is drawn in two layers"
            out[part] = int(number)
    return out


def part(module: str) -> str:
    """The part a module belongs to: `kimidflash.bench.ab` -> bench, `kimidflash` -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def part_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, targets in edges.items():
        out.setdefault(part(a), set()).update(part(b) for b in targets if part(b) != part(a))
    return out


def layer_violations(edges: dict[str, set[str]], drawn: dict[str, int]) -> list[str]:
    found = [f"{p} is in no layer of docs/architecture.md" for p in sorted(edges) if p not in drawn]
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if a in drawn and b in drawn and drawn[b] > drawn[a]:
                found.append(f"{a} (layer {drawn[a]}) imports {b} (layer {drawn[b]})")
            if a < b and a in edges.get(b, ()):
                found.append(f"{a} and {b} import each other")
    return found


def test_the_layer_check_sees_a_climbing_import_a_mutual_pair_and_an_undrawn_part(tmp_path):
    pkg = tmp_path / PACKAGE
    for sub in ("low", "high", "other"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from ..high import b\n")  # climbs, inside a function
    (pkg / "high" / "b.py").write_text("from ..low import a\n")
    (pkg / "new.py").write_text("")
    edges = part_edges(graph(modules(tmp_path)))
    drawn = layers("# x\n\n## Layers\n\n```text\n1 top: high other\n0 bottom: low __init__\n```\n")
    assert layer_violations(edges, drawn) == [
        "new is in no layer of docs/architecture.md",
        "high and low import each other",
        "low (layer 0) imports high (layer 1)",
    ]


def test_the_code_keeps_the_layers_docs_architecture_draws():
    drawn = layers(ARCHITECTURE.read_text())
    edges = part_edges(graph(modules()))
    assert set(drawn) <= set(edges), f"drawn but not in the package: {sorted(set(drawn) - set(edges))}"
    found = layer_violations(edges, drawn)
    assert not found, "the package's layers (docs/architecture.md, ## Layers):\n" + "\n".join(found)


def test_argument_parsers_are_built_only_in_cli_modules():
    """A command's options are parsed in its CLI module (cli.py, or NAME_cli.py beside NAME.py);
    the module doing the work takes typed values, so it is importable and testable without argparse."""
    built = sorted(
        str(path.relative_to(SRC))
        for name, path in modules().items()
        if "ArgumentParser(" in path.read_text() and not (path.name == "cli.py" or path.stem.endswith("_cli"))
    )
    assert not built, f"argument parsers outside a CLI module: {built}"
    typed = sorted(
        str(path.relative_to(SRC))
        for name, path in modules().items()
        if "argparse" in path.read_text() and not (path.name in ("cli.py", "cliargs.py") or path.stem.endswith("_cli"))
    )
    assert not typed, f"argparse values reach domain modules (give them a typed options value): {typed}"


def test_errors_leave_through_the_error_tree_not_an_exit():
    """The command table is the one place an error becomes an exit status (errors.py): a domain
    module that raised SystemExit or called sys.exit would choose its own status and skip that."""
    entry_points = ("__main__", "imagecheck")  # `python -m kimidflash`, and the script the image build runs by path
    exits = sorted(
        f"{path.relative_to(SRC)}:{n}"
        for name, path in modules().items()
        if path.stem not in entry_points
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\braise SystemExit\b|\bsys\.exit\(", line)
    )
    assert not exits, f"exits outside the command table: {exits}"


def test_the_scripts_that_run_by_path_import_nothing_of_ours():
    """imagecheck.py runs by path while the image builds, before the package is importable: a relative
    import there (an easy slip when one reader replaces a module's own) fails the build, not a fast test."""
    path = SRC / PACKAGE / "docker" / "imagecheck.py"
    ours = [t for t, _, _ in imports("kimidflash.docker.imagecheck", path, modules()) if t.startswith(PACKAGE)]
    assert ours == [], f"{path.name} imports {ours}: it must stay standard-library only"
