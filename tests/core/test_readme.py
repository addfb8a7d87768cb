"""The README's two commands are tested as written.

Fast: the README's test command is the one `.ci/run` runs (its three runs cover the suite once). Slow: the first
fenced bash block (serve, then curl) is run exactly as written by bash in a
fresh clone of this checkout's HEAD with an empty project cache and the
clone's own new venv, as on a machine with nothing cached; the curl must get
a non-empty completion.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import time

import pytest

from ..support.helpers import ROOT

README = ROOT / "README.md"
README_PORT = 8262  # what the README's curl asks; the block is run as written


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def commands(block: str) -> list[str]:
    """The block's command lines (comments and blank lines dropped)."""
    return [line.strip() for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_starts_with_the_serve_block_then_the_test_command():
    blocks = bash_blocks(README.read_text())
    serve, tests = commands(blocks[0]), commands(blocks[1])
    assert serve[0].startswith("./serve.sh configs/cpu-reference.env")
    assert serve[-1].startswith("curl ") and "/v1/chat/completions" in serve[-1]
    assert tests == ["scripts/test.sh"]


def test_readme_test_command_is_what_ci_runs():
    """.ci/run runs the README's test command as three pytest runs (the fast tier, then the slow tier
    in two processes at once): their -m expressions must cover every test the command runs exactly
    once, and no other filter may drop one."""
    from _pytest.mark.expression import Expression

    tests = commands(bash_blocks(README.read_text())[1])[0]
    ci = (ROOT / ".ci" / "run").read_text()
    runner = re.search(r"^run\(\) \{ (.*?); \}$", ci, re.M)
    assert runner and runner.group(1).split()[0] == tests, f".ci/run never runs the README's test command {tests!r}"
    # The arguments every run shares may only be pytest's reporting and time limits, never a tier filter.
    assert not any(a in ("-m", "-k") or a.startswith(("-m=", "-k=")) for a in runner.group(1).split()[1:]), runner
    runs = re.findall(r"^run (.*?)(?: \|\||$| 2>&1)", ci, re.M)
    exprs = [re.fullmatch(r'-m "([^"]+)" .*', r).group(1) for r in runs]
    assert not any("-k" in r.split() for r in runs), runs
    compiled = [Expression.compile(e) for e in exprs]
    for marks in itertools.product((False, True), repeat=3):
        present = dict(zip(("slow", "beside", "extra"), marks, strict=False))
        hits = sum(c.evaluate(lambda name, present=present, **kw: present.get(name, False)) for c in compiled)
        assert hits == (0 if present["extra"] else 1), (present, exprs)  # `extra` stays out, as in addopts


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _stop_group(pgid: int, wait_s: float = 120) -> None:
    """SIGTERM what the block left running (serve in the background), as Ctrl-C would."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(pgid):
            return
        os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(1)


@pytest.mark.slow
def test_readme_serve_block_answers_from_a_fresh_clone_with_nothing_cached(tmp_path):
    block = bash_blocks(README.read_text())[0]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIMIDFLASH_", "VIRTUAL_ENV", "PYTEST"))}
    env["KIMIDFLASH_CACHE"] = str(tmp_path / "empty-cache")  # nothing made by an earlier run or test
    # Kept: content-addressed downloads (pip's cache, KIMIDFLASH_DOWNLOADS), as on any CI run.
    if os.environ.get("KIMIDFLASH_DOWNLOADS"):
        env["KIMIDFLASH_DOWNLOADS"] = os.environ["KIMIDFLASH_DOWNLOADS"]
    out = tmp_path / "block.out"
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            ["bash", "-c", block],
            cwd=clone,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=1800)
        finally:
            _stop_group(proc.pid)
    text = out.read_text(errors="replace")
    at = text.rfind('{"id"')  # curl prints no newline: serve's log lines may follow on the same line
    assert at >= 0, f"no completion from the README's curl; output:\n{text[-4000:]}"
    body, _ = json.JSONDecoder().raw_decode(text, at)
    assert body["model"] == "smollm2-135m-dflash"
    assert body["choices"][0]["message"]["content"].strip(), body
    assert (clone / ".venv").is_dir()  # the clone made its own venv: nothing came from ours
    assert (tmp_path / "empty-cache" / "models" / "smollm2-135m-instruct").is_dir()
