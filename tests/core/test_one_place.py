"""One place per concern, kept so by reading the code (issue: a core that is easy to change).

Each rule here is one a later edit could quietly break: an error class defined beside the code that
raises it, a literal exit status chosen by a command, a checkpoint's config.json opened without its one
reader, a training phase that branches on the engine or the family instead of asking their tables.
"""

from __future__ import annotations

import ast
import re

from .test_architecture import SRC, modules

ERRORS = SRC / "kimidflash" / "errors.py"


def _classes(tree: ast.AST) -> list[ast.ClassDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def _base_names(c: ast.ClassDef) -> list[str]:
    return [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in c.bases]


def _is_error(c: ast.ClassDef) -> bool:
    return any(n.endswith(("Error", "Exception", "Failed")) or n == "KimidflashError" for n in _base_names(c))


def test_every_error_class_is_defined_in_errors_py():
    outside = sorted(
        f"{path.relative_to(SRC)}:{c.lineno} {c.name}"
        for path in modules().values()
        if path != ERRORS
        for c in _classes(ast.parse(path.read_text()))
        if _is_error(c)
    )
    assert not outside, f"error classes outside errors.py (put them in the one tree): {outside}"


def test_the_tree_in_errors_docstring_names_every_class_it_defines():
    tree = ast.parse(ERRORS.read_text())
    drawn = set(re.findall(r"[├└]── (\w+)", ast.get_docstring(tree) or ""))
    defined = {c.name for c in _classes(tree) if _is_error(c)} - {"KimidflashError"}  # the root, drawn unmarked
    assert defined == drawn, f"defined only: {sorted(defined - drawn)}; drawn only: {sorted(drawn - defined)}"


def test_no_command_chooses_a_literal_nonzero_exit_status():
    """A command returns a named status (errors.EXIT_*) or raises; imagecheck.py is a standalone script."""
    literal = sorted(
        f"{path.relative_to(SRC)}:{n}"
        for path in modules().values()
        if path.stem not in ("errors", "imagecheck")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*return (1|2|3|127|130|143)\s*(#.*)?$", line)
    )
    assert not literal, f"literal exit statuses (name them in errors.py): {literal}"


def test_a_bad_input_status_is_chosen_by_the_command_table_alone():
    """EXIT_USAGE follows a RecipeError through commands.dispatch: a command that caught the error and
    returned it itself would print its own form and skip the table."""
    chosen = sorted(
        f"{path.relative_to(SRC)}"
        for path in modules().values()
        if path.stem not in ("errors", "commands") and "EXIT_USAGE" in path.read_text()
    )
    assert not chosen, f"modules that return EXIT_USAGE themselves: {chosen}"


def test_a_checkpoints_config_json_is_read_through_checkpoint_layout():
    """Writers and existence checks may name config.json; reading it is checkpoint_layout.read_config's."""
    read = re.compile(r"(read_json\w*|json\.loads?)\([^)]*config\.json")
    found = sorted(
        f"{path.relative_to(SRC)}:{n}"
        for path in modules().values()
        if path.stem != "checkpoint_layout"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if read.search(line)
    )
    assert not found, f"config.json read outside checkpoint_layout: {found}"


def test_training_asks_its_tables_instead_of_branching_on_engine_or_family():
    """train/engines.py holds the engines and the drafter families as objects. The training config may
    say which file drafter_config is (train/config.py); nothing else in train/ compares the names."""
    branch = re.compile(r"\.(engine|method)\s*[!=]=|\b(engine|method)\s*[!=]=\s*[\"']")
    found = sorted(
        f"{path.relative_to(SRC)}:{n}"
        for path in (SRC / "kimidflash" / "train").rglob("*.py")
        if path.name not in ("engines.py", "config.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if branch.search(line)
    )
    assert not found, f"branches on train.engine or train.method outside their tables: {found}"
