"""A scripted copy of the tiny K2.6: the same checkpoint and tokenizer, rewritten so that
greedy decoding writes one fixed Kimi reply whatever the prompt says.

The parsers a K2.6 server runs (`kimi_k2` reasoning and tool calls) act on tokens a
random model never chooses: it never closes `<think>` nor opens a tool-call section.
Here every attention and MLP output projection is zero, so the residual stream at
the head is the last token's embedding and the next token depends on that token
alone (a bigram model). Each token of the script gets its own basis direction in the
embedding and the head row of its successor reads that direction; every other
embedding and head row is kept out of those directions. So the reply after the
generation prompt (`...<|im_middle|>`, or `...</think>` with thinking off) is the
rest of SCRIPT, exactly, with MLA, MoE and the vision tower still loaded and run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REASONING, CONTENT, FUNCTION, ARGUMENTS = "The model", "reads the prompt", "lookup", "{}"
SEGMENTS = [
    "<|im_middle|>",
    "<think>",
    REASONING,
    "</think>",
    CONTENT,
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    f"functions.{FUNCTION}:0",
    "<|tool_call_argument_begin|>",
    ARGUMENTS,
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<|im_end|>",
]
HEAD_GAIN = 4.0


def script_ids(tokenizer_json: Path) -> list[int]:
    """The script's token ids; each id at most once, or a bigram model could not follow it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    ids: list[int] = []
    for seg in SEGMENTS:
        special = tok.token_to_id(seg) if seg.startswith("<") else None
        ids += [special] if special is not None else tok.encode(seg, add_special_tokens=False).ids
    assert len(set(ids)) == len(ids), f"a token repeats in the script: {ids}"
    return ids


def write_scripted(source: Path, out: Path) -> list[int]:
    """Copy the generated tiny K2.6 at `source` to `out` with scripted weights; return the script's ids."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    ids = script_ids(out / "tokenizer.json")
    state = load_file(str(out / "model.safetensors"))
    for name in state:
        if name.endswith(("self_attn.o_proj.weight", "down_proj.weight")) and name.startswith("language_model."):
            state[name] = torch.zeros_like(state[name])
    embed = state["language_model.model.embed_tokens.weight"].clone()
    head = state["language_model.lm_head.weight"].clone()
    n = len(ids) - 1  # every script token but the last has a successor
    embed[:, :n] = 0.0
    head[:, :n] = 0.0
    for i, (token, successor) in enumerate(zip(ids, ids[1:], strict=False)):
        embed[token] = 0.0
        embed[token, i] = 1.0
        head[successor, i] = HEAD_GAIN
    state["language_model.model.embed_tokens.weight"] = embed
    state["language_model.lm_head.weight"] = head
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "kimidflash-script.json").write_text(json.dumps({"segments": SEGMENTS, "ids": ids}) + "\n")
    return ids
