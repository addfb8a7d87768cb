"""The bench package's shape: modules that import alone without torch or
matplotlib, bad-input errors the command table understands, and the one command
table behind `benchmark_multi_turn.py` (tests/core/test_architecture.py checks the
imports of the whole package)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kimidflash.bench.cli import main
from kimidflash.bench.metrics import metrics_url_for, server_root
from kimidflash.errors import BenchError, MetricsError, PromptError, RecipeError, ReportError, ResultError
from kimidflash.paths import REPO_ROOT

BENCH = REPO_ROOT / "src" / "kimidflash" / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """An import cycle shows only when the cycle's second module is imported first."""
    code = (
        "import importlib, sys\n"
        f"for m in {MODULES!r}:\n"
        "    for k in [k for k in sys.modules if k.startswith('kimidflash')]:\n"
        "        del sys.modules[k]\n"
        "    importlib.import_module('kimidflash.bench.' + m)\n"
        "print('torch' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]  # charts import matplotlib only to draw


@pytest.mark.parametrize("error", [BenchError, ResultError, ReportError, PromptError])
def test_bad_input_errors_are_recipe_errors(error: type[Exception]) -> None:
    assert issubclass(error, RecipeError)


def test_value_errors_stay_value_errors() -> None:
    for error in (ResultError, ReportError, PromptError, MetricsError):
        assert issubclass(error, ValueError)
    assert not issubclass(MetricsError, RecipeError)  # a server's garbage, recorded, not the user's input


def test_metrics_url_and_server_root_agree() -> None:
    for base in ("http://h:8262/v1", "http://h:8262/v1/", "http://h:8262"):
        assert server_root(base) == "http://h:8262"
        assert metrics_url_for(base) == "http://h:8262/metrics"


def test_options_first_means_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "m"]) == 2
    default = capsys.readouterr().err
    assert main(["run", "--model", "m"]) == 2
    assert capsys.readouterr().err == default
    assert default.startswith("benchmark_multi_turn.py run: --base-url is required")


def test_help_shows_the_seed_options_and_names_the_other_commands_and_a_typo_gets_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The seed's users type `benchmark_multi_turn.py --help` for the benchmark's options: they get run's,
    with the other commands named in its description."""
    with pytest.raises(SystemExit) as done:  # argparse's own --help
        main(["--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for option in ("--base-url", "--sessions", "--turns-per-session", "--max-tokens", "--output"):
        assert option in out, option
    for name in ("compare", "validate", "export-prompts"):
        assert f"benchmark_multi_turn.py {name} -h" in out, name
    assert main(["compaer", "a.json"]) == 2
    assert "did you mean 'compare'?" in capsys.readouterr().err
