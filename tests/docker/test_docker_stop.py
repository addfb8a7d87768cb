"""ContainerServer.stop when the engine refuses the stop: a container whose process the kernel is still
tearing down (dockerd: "tried to kill container, but did not receive an exit event") exits a minute later.
CI once lost the next test to such a container left behind under the managed label."""

from __future__ import annotations

import threading

import docker
import pytest

from kimidflash.docker.run import ContainerServer


class SlowToDie:
    """A container the engine fails to stop, kill and remove until it has exited after `refusals` tries."""

    def __init__(self, refusals: int, exit_code: int = 137):
        self.refusals, self.exit_code = refusals, exit_code
        self.status, self.attrs, self.removed, self.kills = "running", {"State": {"ExitCode": 0}}, False, 0

    def _refuse(self) -> None:
        raise docker.errors.APIError("tried to kill container, but did not receive an exit event")

    def stop(self, timeout: int) -> None:
        self._refuse()

    def kill(self) -> None:
        self.kills += 1
        if self.kills >= self.refusals:
            self.status, self.attrs = "exited", {"State": {"ExitCode": self.exit_code}}
        else:
            self._refuse()

    def reload(self) -> None:
        pass

    def remove(self, force: bool) -> None:
        if self.status == "running":
            self._refuse()
        self.removed = True


def server(container: SlowToDie) -> ContainerServer:
    s = ContainerServer.__new__(ContainerServer)  # no engine: the container is the fake
    s.container, s._exit, s._removed, s._pump = container, None, False, threading.Thread(target=lambda: None)
    s._pump.start()
    return s


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr("kimidflash.docker.run.time.sleep", lambda s: None)


def test_a_container_that_refuses_the_stop_is_waited_for_then_removed():
    c = SlowToDie(refusals=3)
    assert server(c).stop() == 137 and c.removed and c.kills == 3


def test_one_that_never_exits_is_reported_as_unknown_after_the_settle_time(monkeypatch):
    clock = iter(range(0, 10_000, 30))
    monkeypatch.setattr("kimidflash.docker.run.time.monotonic", lambda: next(clock))
    c = SlowToDie(refusals=10**9)
    assert server(c).stop(settle=120) == -1 and not c.removed
