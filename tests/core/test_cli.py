"""The command table and its one dispatcher: help, typos, exit statuses."""

from __future__ import annotations

import sys
import types

import pytest

from kimidflash import cli
from kimidflash.commands import Command, dispatch
from kimidflash.errors import EXIT_INTERRUPTED, EXIT_USAGE, RecipeError


@pytest.fixture
def fake_module(monkeypatch):
    """A module `fakecmds` whose functions record their argv or raise on request."""
    mod = types.ModuleType("fakecmds")
    mod.calls = []

    def ok(argv):
        mod.calls.append(argv)
        return 0

    def bad(argv):
        raise RecipeError("MODEL_DIR (configs/x.env): not a directory")

    def interrupted(argv):
        raise KeyboardInterrupt

    mod.ok, mod.bad, mod.interrupted = ok, bad, interrupted
    monkeypatch.setitem(sys.modules, "fakecmds", mod)
    return mod


TABLE = (
    Command("run", "fakecmds:ok", "run it"),
    Command("compare", "fakecmds:ok", "compare results"),
    Command("bad", "fakecmds:bad", "always bad input"),
    Command("stop", "fakecmds:interrupted", "Ctrl-C"),
)


def run(argv, **kw):
    return dispatch(TABLE, argv, prog="tool", description="a test table", **kw)


def test_the_command_gets_its_own_argv(fake_module):
    assert run(["compare", "a.json", "--markdown", "x.md"]) == 0
    assert fake_module.calls == [["a.json", "--markdown", "x.md"]]


def test_help_lists_every_command_and_exits_0(fake_module, capsys):
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {c.name}" in out and c.help in out for c in TABLE)


def test_no_command_is_usage_on_stderr_exit_2(fake_module, capsys):
    assert run([]) == EXIT_USAGE
    assert "usage: tool COMMAND" in capsys.readouterr().err


def test_a_typo_gets_a_suggestion_and_exit_2(fake_module, capsys):
    assert run(["compre", "a.json"]) == EXIT_USAGE
    assert capsys.readouterr().err.strip() == "tool: unknown command 'compre'; did you mean 'compare'?"
    assert fake_module.calls == []


def test_a_name_far_from_any_lists_them_all(fake_module, capsys):
    assert run(["zzz"]) == EXIT_USAGE
    assert "one of: run, compare, bad, stop" in capsys.readouterr().err


def test_bad_input_is_one_line_exit_2(fake_module, capsys):
    assert run(["bad"]) == EXIT_USAGE
    assert capsys.readouterr().err == "tool bad: MODEL_DIR (configs/x.env): not a directory\n"


def test_ctrl_c_is_exit_130(fake_module, capsys):
    assert run(["stop"]) == EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err


def test_a_default_command_takes_options_without_a_name(fake_module):
    assert run(["--base-url", "http://x/v1"], default="run") == 0
    assert run([], default="run") == 0
    assert fake_module.calls == [["--base-url", "http://x/v1"], []]


def test_other_errors_are_not_swallowed(fake_module, monkeypatch):
    monkeypatch.setattr(fake_module, "ok", lambda argv: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run(["run"])


@pytest.mark.parametrize("command", cli.COMMANDS, ids=lambda c: c.name)
def test_every_command_of_the_real_table_has_help(command, capsys):
    """Each row names an importable main that answers --help with exit 0."""
    with pytest.raises(SystemExit) as exit_:
        rc = cli.main([command.name, "--help"])
        raise SystemExit(rc)
    assert exit_.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out.lower()


def test_the_real_table_suggests_on_a_typo(capsys):
    assert cli.main(["valdate-fp8"]) == EXIT_USAGE
    assert "did you mean 'validate-fp8'?" in capsys.readouterr().err
