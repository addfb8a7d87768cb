"""One rank of the data-parallel check in test_train_ddp.py (run under torchrun, CPU, gloo).

Trains the tiny drafter of test_train_model on its fake store for a few
steps and writes what this rank ended with, for the test to compare.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from kimidflash.train.trainer import train_loop

from ..train.test_train_model import SHAPE, TRAIN, FakeStore, head


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    tc = dict(TRAIN, autocast="none")
    res = train_loop(SHAPE, tc, FakeStore(), *head(), out / "checkpoints", seed=3, resume=False, progress=False)
    state = res["model"].state_dict()
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "step": res["step"],
                "first_loss": res["history"][0]["loss"],
                "fc": state["fc.weight"].flatten()[:64].tolist(),
                "checksum": float(sum(v.double().sum() for v in state.values())),
            }
        )
    )
    # Both ranks leave gloo together: a rank that tears it down while its peer still writes
    # aborts that peer ("terminate called without an active exception", seen once in CI).
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
