"""One progress-bar style for every phase (rich), quiet when not on a terminal."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@contextlib.contextmanager
def bar(label: str, total: int, start: int = 0) -> Iterator[Callable[..., None]]:
    """Yield `advance(n=1, **fields)`; renders on stderr (a log file gets periodic lines instead)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        state = {"n": start, "last": -1}
        step = max(1, total // 20)

        def advance(n: int = 1, **fields: object) -> None:
            state["n"] += n
            if state["n"] // step != state["last"] or state["n"] >= total:
                state["last"] = state["n"] // step
                extra = " ".join(f"{k}={v}" for k, v in fields.items())
                print(f"[{label}] {state['n']}/{total} {extra}", file=sys.stderr, flush=True)

        yield advance
        return
    cols = (
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*cols, console=console) as prog:
        task = prog.add_task(label, total=total, completed=start, info="")

        def advance(n: int = 1, **fields: object) -> None:
            prog.update(task, advance=n, info=" ".join(f"{k}={v}" for k, v in fields.items()))

        yield advance
