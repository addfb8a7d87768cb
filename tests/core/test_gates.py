"""The lint, format and type gates, run in the fast tier as CI runs them.

ruff and mypy are configured in pyproject.toml and pinned in its `test` extra, so a
fresh clone runs the versions these gates were written against. A gate counts
only while nothing turns it off: the last test refuses blanket ignores, which
would let a gate pass without reading the code.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def gate(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("argv", [("ruff", "check", "."), ("ruff", "format", "--check", ".")], ids=["lint", "format"])
def test_ruff(argv: tuple[str, ...]) -> None:
    r = gate(*argv)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_mypy_over_the_package() -> None:
    r = gate("mypy")  # files, strictness and the third-party overrides are pyproject's
    assert r.returncode == 0 and "Success" in r.stdout, r.stdout[-6000:] + r.stderr[-2000:]


def test_the_gates_are_configured_as_the_project_promises() -> None:
    ruff = PYPROJECT["tool"]["ruff"]
    assert ruff["line-length"] <= 120
    assert {"E", "W", "F", "I", "B", "UP", "SIM"} <= set(ruff["lint"]["select"])
    assert not ruff["lint"].get("ignore") and not ruff["lint"].get("per-file-ignores")
    assert not ruff.get("exclude") and not ruff.get("extend-exclude")
    mypy = PYPROJECT["tool"]["mypy"]
    assert mypy["files"] == ["src/kimidflash"] and mypy["disallow_untyped_defs"] is True
    assert not mypy.get("ignore_errors")
    for override in mypy.get("overrides", []):  # third-party modules only, never ours
        assert not override.get("ignore_errors")
        assert not any(m.startswith("kimidflash") for m in override["module"]), override


BLANKET = re.compile(r"#\s*(ruff:\s*noqa|mypy:\s*ignore-errors|type:\s*ignore(?!\[)|noqa(?!:))", re.IGNORECASE)


def test_no_blanket_ignore_in_the_code() -> None:
    """A suppression names its rule (`# noqa: E402`, `# type: ignore[attr-defined]`): a bare one
    silences every rule on the line, a file-level one the whole file."""
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for top in ("src", "tests", "scripts", "patches", "payload")
        for path in sorted((ROOT / top).rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if BLANKET.search(line) and path.name != "test_gates.py"
    ]
    assert not found, "\n".join(found)
