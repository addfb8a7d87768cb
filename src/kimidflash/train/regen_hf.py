"""regen.source=hf: the target's greedy answers from a Hugging Face forward, batched on the train device.

Why a second source: regenerating tens of thousands of prompts through the
served target takes hours on a CPU, and a GPU training node may have no vLLM
build at all. This path runs the same checkpoint with `generate()` in batches
of `regen.concurrency` prompts on `train.device` (a GPU when torch sees one)
and writes records of exactly the served path's shape: the chat template is
the tokenizer's own (what vLLM applies for `/v1/chat/completions`), the
response keeps its end-of-sequence token as vLLM's `token_ids` do, and
`finish_reason` is `stop` or `length`.

Greedy only (`regen.temperature` 0): sampled answers would need vLLM's
sampler to be the same distribution. Matmuls run at full float32 precision
(no TF32), so the answers are the target's greedy ones up to the rounding of
batched kernels; where that rounding flips a near-tie the two paths diverge
from that token on (tests/train/test_regen_hf_slow.py requires records the served
path wrote on this CPU to come back token for token).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import RegenError
from .data import Record, RecordWriter, make_record
from .device import float32_matmul
from .progress import bar

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def prompt_ids(tok: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """The ids the served path sees: the chat template with the generation prompt, no extra BOS."""
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def stop_ids(model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    if not ids:
        raise RegenError("the target names no end-of-sequence token (generation_config or tokenizer)")
    return ids


def split_response(row: Sequence[int], stops: set[int], max_tokens: int) -> tuple[list[int], str]:
    """The generated ids up to and including the first stop token, and why generation ended."""
    out: list[int] = []
    for t in row[:max_tokens]:
        out.append(int(t))
        if t in stops:
            return out, "stop"
    return out, "length"


@torch.no_grad()
def generate_batch(
    model: PreTrainedModel,
    pad_id: int,
    prompts: Sequence[list[int]],
    max_tokens: int,
    stops: set[int],
    device: torch.device,
) -> list[tuple[list[int], str]]:
    """Greedy answers to token-id prompts, left-padded into one batch."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        att[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=att.to(device),
        max_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=sorted(stops),
        pad_token_id=pad_id,
    )
    return [split_response(row[width:].tolist(), stops, max_tokens) for row in out.cpu()]


WINDOW_BATCHES = 8  # batches sorted together: widths shrink, and a cut run still spans the set's order


def batches(lengths: Sequence[int], batch: int, window: int = WINDOW_BATCHES) -> list[list[int]]:
    """Indices of the prompts in generation order: windows of `window` batches in the set's order, each
    window's prompts sorted by length and cut into batches of `batch`.

    Why: a batch is padded to its longest prompt. BIG-bench prompts run from 35 to over 2,000 tokens
    (median about 100), so batches in the set's order were nearly all padding, and on an H200 their
    time went to that padding (benchmarks/drafter/gpu-h200-1/). Sorting the whole set would let a run
    cut short answer only short prompts; windows keep a cut run's answers spread over the set (which
    `bigbench:train-wide` deals over tasks) and leave the rest to the resumed run."""
    if batch < 1 or window < 1:
        raise RegenError(f"batch and window must be at least 1, got {batch} and {window}")
    out: list[list[int]] = []
    span = batch * window
    for start in range(0, len(lengths), span):
        order = sorted(range(start, min(start + span, len(lengths))), key=lambda i: (lengths[i], i))
        out += [order[i : i + batch] for i in range(0, len(order), batch)]
    return out


def answer(
    model: PreTrainedModel,
    pad_id: int,
    prompts: Sequence[list[int]],
    max_tokens: int,
    stops: set[int],
    device: torch.device,
) -> list[tuple[list[int], str]]:
    """`generate_batch`, halving a batch the device has no memory for (the prefill's attention
    grows with the batch times its longest prompt squared: 1,024 BIG-bench prompts of up to 2,000
    characters ran out of an H100's 80 GB) until it fits; one prompt that does not fit is the error."""
    try:
        return generate_batch(model, pad_id, prompts, max_tokens, stops, device)
    except torch.OutOfMemoryError:
        if len(prompts) == 1:
            raise
    if device.type == "cuda":
        torch.cuda.empty_cache()
    half = len(prompts) // 2
    return answer(model, pad_id, prompts[:half], max_tokens, stops, device) + answer(
        model, pad_id, prompts[half:], max_tokens, stops, device
    )


def regen_hf(
    model_dir: str | Path,
    prompts: Sequence[dict],
    out: Path,
    *,
    batch: int,
    max_tokens: int,
    temperature: float,
    device: torch.device,
    trust_remote_code: bool = False,
) -> int:
    """Answer `prompts`, `batch` at a time, appending to `out`; returns how many were written.

    Batches come in the order of `batches`: by length within windows that follow the prompts'
    order, so a run stopped early has answered the windows before it and part of one (not, say,
    the set's shortest prompts); each finished batch is appended and flushed, so an interrupted
    run keeps every whole batch and a rerun answers the rest. `trust_remote_code`: as the serve config says
    (target.TargetInfo); Kimi's tokenizer needs it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if temperature != 0:
        raise RegenError(
            f"regen.source=hf generates greedily; regen.temperature is {temperature} (set 0, "
            "or regenerate through the server for sampled answers)"
        )
    if batch < 1:
        raise RegenError(f"regen.concurrency must be at least 1 (the batch size of regen.source=hf), got {batch}")
    if not prompts:
        return 0
    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    model = (
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, trust_remote_code=trust_remote_code)
        .eval()
        .to(device)
    )
    stops = stop_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(stops)
    encoded = [(p, prompt_ids(tok, p["prompt"])) for p in prompts]
    writer = RecordWriter(out)
    done = 0
    try:
        with float32_matmul("highest"), bar("regen", len(encoded)) as advance:
            for idx in batches([len(ids) for _, ids in encoded], batch):
                group = [encoded[i] for i in idx]
                answers = answer(model, pad, [ids for _, ids in group], max_tokens, stops, device)
                recs: list[Record] = [
                    make_record(p["id"], p["prompt"], ids, resp, why)
                    for (p, ids), (resp, why) in zip(group, answers, strict=False)
                ]
                writer.write_many(recs)
                done += len(recs)
                advance(len(recs))
    finally:
        writer.close()
    return done
