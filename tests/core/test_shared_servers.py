"""The slow tier's shared servers (tests/conftest.py): one start per served config in a pytest
process, whichever module asks, and never more than `keep` at once."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from .. import conftest
from ..support.helpers import CONFIGS, SERVE_SH

REFERENCE = CONFIGS / "cpu-reference.env"


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Replace the real server with a record of each start and stop."""
    log: list[tuple] = []

    @contextlib.contextmanager
    def serving(config, *overrides, cmd=None):
        server = SimpleNamespace(proc=SimpleNamespace(poll=lambda: None), overrides=overrides)
        log.append(("start", overrides))
        try:
            yield server
        finally:
            log.append(("stop", overrides))

    monkeypatch.setattr(conftest, "serving", serving)
    return log


def test_asks_that_render_the_same_command_share_one_server(starts):
    servers = conftest.SharedServers()
    a = servers.get(REFERENCE, "DTYPE=float32", "SPECULATIVE_METHOD=none", cmd=SERVE_SH)
    b = servers.get(REFERENCE, "SPECULATIVE_METHOD=none", cmd=SERVE_SH)  # float32 is the config's own dtype
    assert a is b and servers.started == 1
    c = servers.get(REFERENCE, "SPECULATIVE_METHOD=none")  # another launcher is another server
    d = servers.get(REFERENCE, "SPECULATIVE_METHOD=none", "MAX_MODEL_LEN=1024", cmd=SERVE_SH)
    assert len({id(a), id(c), id(d)}) == 3 and servers.started == 3
    servers.close()
    assert [e for e, _ in starts].count("stop") == 3 and not servers.running


def test_at_most_keep_run_and_the_least_recently_asked_stops_first(starts):
    servers = conftest.SharedServers(keep=2)
    servers.get(REFERENCE, "SPECULATIVE_METHOD=none")
    servers.get(REFERENCE, "MAX_MODEL_LEN=1024")
    servers.get(REFERENCE, "SPECULATIVE_METHOD=none")  # asked again: now the most recent
    servers.get(REFERENCE, "MAX_MODEL_LEN=512")
    assert starts[-2:] == [("stop", ("MAX_MODEL_LEN=1024",)), ("start", ("MAX_MODEL_LEN=512",))]
    assert len(servers.running) == 2
    servers.close()


def test_a_server_that_died_is_started_again(starts):
    servers = conftest.SharedServers()
    first = servers.get(REFERENCE, "SPECULATIVE_METHOD=none")
    first.proc.poll = lambda: 1
    again = servers.get(REFERENCE, "SPECULATIVE_METHOD=none")
    assert again is not first and servers.started == 2
    assert starts == [("start", ("SPECULATIVE_METHOD=none",))] * 1 + [
        ("stop", ("SPECULATIVE_METHOD=none",)),
        ("start", ("SPECULATIVE_METHOD=none",)),
    ]
    servers.close()
