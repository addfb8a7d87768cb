"""THE stop of a process group: `serve`'s launcher child and the background server a
command or test starts are both stopped here, so the order of signals and the waits are
decided once.

A process this package starts runs in its own session (``start_new_session=True``), so its
pid is its group's id and the group holds what it spawned (vLLM's engine core and workers).
A leaf module (stdlib only).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

KILL_WAIT_S = 10.0  # after SIGKILL: the kernel, not the process, decides; this only bounds the wait


def stop_group(proc: subprocess.Popen, grace: float, leader_only: bool = False) -> int:
    """SIGTERM, then SIGKILL after `grace` seconds, then the group's last members; the exit status.

    `leader_only` sends the SIGTERM to the leader alone, as a user's Ctrl-C or kill would reach
    `serve`, which then stops its own children in order; otherwise the whole group gets it. The
    final SIGKILL goes to the group either way: children may outlive their leader."""
    if proc.poll() is None:
        try:
            if leader_only:
                proc.send_signal(signal.SIGTERM)
            else:
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=KILL_WAIT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()
