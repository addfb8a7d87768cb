"""The speculators engine's capture: our regen records to speculators' offline hidden states.

speculators trains DFlash from files that its own `generate-offline-data` pulls
out of a served target: one `hs_<i>.safetensors` per sample of the data set
`prepare-data` wrote (i is the sample's index there, after prepare-data's
shuffle), holding `token_ids [T]` and `hidden_states [T, layers, H]`. The
layers are the drafter's target layers and then the last decoder layer's output
(pre-norm), which speculators reads as the verifier's state; so the server
captures `target_layer_ids + [L-1]` (the config rules say on which pins that
last one exists). The server is the recipe's own (`served`, extract_hidden_states
and ExampleHiddenStatesConnector), or `capture.base_url`.

Everything is derived from run/regen.jsonl and kept under run/speculators/:
rows.jsonl (the training split as pre-tokenized rows), data/ (prepare-data),
hidden_states/ (the files), vllm-states/ (where the server writes before
generate-offline-data moves a file over: the same disk, so a move is a rename).
Rerunning resumes: prepare-data keeps a finished data set and
generate-offline-data skips the files it has; once all are written,
captured.txt says so and a rerun starts no server. A stamp of the rows, the
sequence length and the layers (stamp.txt) guards all three: when any changes,
data/ and hidden_states/ are made again, since a file's index means nothing in
another data set.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ...background import served
from ...checkpoint_layout import require_config, text_field
from ...errors import SpeculatorsError, TrainConfigError
from ...fsio import write_text_atomic
from ...logtail import Log
from ..config import TrainConfig
from ..plan import GiB, capture_bytes_per_token, free_disk
from ..target import capture_overrides, target_info
from .cli import run_logged, speculators_argv
from .commands import prepare_data_args
from .rows import write_rows

WIDE = {"COLUMNS": "160"}  # speculators logs through rich, which wraps at 80 columns without a terminal


def captured_layers(cfg: TrainConfig, num_hidden_layers: int) -> list[int]:
    """The drafter's target layers, then the last layer's output: the order vLLM stacks them
    in (by depth), and the order speculators splits them in (`[:, :-1]` features, `[:, -1]` verifier)."""
    shape = cfg.shape()
    shape.check_target(num_hidden_layers)
    ids = list(shape.target_layer_ids)
    if ids != sorted(set(ids)):
        raise TrainConfigError(
            f"{shape.source}: target_layer_ids {ids} must ascend: vLLM writes the layers "
            "by depth, so the features would reach the drafter in another order"
        )
    return ids + [num_hidden_layers - 1]


def check_disk(
    run: Path, folder: Path, tokens: int, per_token: int, min_free_gb: float, free: float | None = None
) -> float:
    """Bytes still to write (what the files there already hold is counted as written);
    refused when that does not fit the free disk less `min_free_gb`."""
    have = sum(p.stat().st_size for p in folder.glob("hs_*.safetensors")) if folder.is_dir() else 0
    need = max(0, tokens * per_token - have)
    free = free_disk(folder) if free is None else free
    room = free - min_free_gb * GiB
    if need > room:
        raise TrainConfigError(
            f"{run}: capturing hidden states needs {need / GiB:.1f} GiB ({tokens} tokens x "
            f"{per_token} bytes), {free / GiB:.1f} GiB free less data.min_free_disk_gb="
            f"{min_free_gb:g}; free disk, cap regen.records or use a larger disk"
        )
    return need


def row_tokens(rows: Path, seq_length: int) -> int:
    """Tokens prepare-data keeps: each row cut to `seq_length`."""
    with open(rows) as f:
        return sum(min(len(json.loads(line)["input_ids"]), seq_length) for line in f if line.strip())


def refresh(spec: Path, stamp: str, log: Log) -> None:
    """Drop data/ and hidden_states/ made from other rows, length or layers (see the module docstring),
    and a data/ that prepare-data left unfinished (it would skip it forever)."""
    stamp_file, data = spec / "stamp.txt", spec / "data"
    old = stamp_file.read_text() if stamp_file.is_file() else None
    stale = [data, spec / "hidden_states"] if old is not None and old != stamp else []
    if not stale and data.is_dir() and not (data / "state.json").is_file():
        stale = [data]
    for d in stale:
        if d.exists():
            log(f"capture: removing {d} (made from other rows, length or layers, or unfinished)")
            shutil.rmtree(d)
    write_text_atomic(stamp_file, stamp)


PROCESSOR_FILES = ("config.json", "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def tokenizer_dir(model_dir: Path, spec: Path) -> Path:
    """What prepare-data's --model loads: it asks AutoProcessor, which for a multimodal wrapper
    (Kimi K2.6's preprocessor_config.json and model type) builds the image processor too, and
    that needs torchvision, which the venv leaves out (venv.py). Our rows are tokenized
    already, so a folder of the checkpoint's links minus its processor and model configs
    leaves AutoProcessor the tokenizer alone, loaded as before (tokenizer_config.json)."""
    if not any((model_dir / f).is_file() for f in PROCESSOR_FILES[1:]):
        return model_dir
    view = spec / "tokenizer"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.name not in PROCESSOR_FILES:
            (view / f.name).symlink_to(f.resolve())
    return view


def capture_offline(cfg: TrainConfig, run: Path, log: Log = print) -> Path:
    """rows -> prepare-data -> disk check -> served target -> generate-offline-data; returns hidden_states/."""
    spec = run / "speculators"
    rows, out = spec / "rows.jsonl", spec / "hidden_states"
    n_rows, _ = write_rows(run / "regen.jsonl", rows, cfg.data.heldout_fraction)
    if not n_rows:
        raise TrainConfigError(f"{run / 'regen.jsonl'}: no training records; run the regen phase")
    info = target_info(cfg)
    tconf = require_config(info.model_dir, "target checkpoint (run the setup phase)", TrainConfigError)
    n_layers, hidden = text_field(tconf, "num_hidden_layers"), text_field(tconf, "hidden_size")
    layers = captured_layers(cfg, n_layers)
    # max_tokens=1 rides on every prompt, so a row may be at most MAX_MODEL_LEN - 1 long
    seq_length = min(cfg.speculators.max_length, (info.max_model_len or 1 << 30) - 1)
    digest = hashlib.sha256(rows.read_bytes()).hexdigest()
    stamp, done = f"rows {digest}\nseq_length {seq_length}\nlayers {layers}\n", spec / "captured.txt"
    refresh(spec, stamp, log)
    if done.is_file() and done.read_text() == stamp and out.is_dir():
        log(f"capture: {out} is complete for these rows (no server started)")
        return out

    prepare = prepare_data_args(
        tokenizer_dir(Path(info.model_dir), spec),
        rows,
        spec / "data",
        seq_length,
        trust_remote_code=info.trust_remote_code,
        seed=cfg.seed,
    )
    run_logged(speculators_argv(*prepare), spec / "prepare-data.log", "prepare-data", env=WIDE, echo=log)

    tokens = row_tokens(rows, seq_length)
    per = capture_bytes_per_token(cfg.shape(), info.dtype)  # the layers above, at the served dtype
    need = check_disk(run, out, tokens, per, cfg.data.min_free_disk_gb)
    log(
        f"capture: {n_rows} rows, {tokens} tokens x {len(layers)} layers {layers} x {hidden} "
        f"({per} bytes a token): {need / GiB:.2f} GiB still to write into {out}"
    )

    def generate(base: str) -> None:
        argv = speculators_argv(
            "generate-offline-data",
            "--endpoint",
            base.rstrip("/").removesuffix("/v1") + "/v1",
            "--preprocessed-data",
            str(spec / "data"),
            "--output",
            str(out),
            "--concurrency",
            str(cfg.capture.concurrency),
            "--validate-outputs",
            "--fail-on-error",
        )
        run_logged(argv, spec / "generate-offline-data.log", "generate-offline-data", env=WIDE, echo=log)

    if cfg.capture.base_url:
        generate(cfg.capture.base_url)
    elif not cfg.target.serve_config:
        raise TrainConfigError(f"{cfg.path}: the speculators capture needs target.serve_config or capture.base_url")
    else:
        states = spec / "vllm-states"
        states.mkdir(parents=True, exist_ok=True)
        with served(
            cfg.target.serve_config, capture_overrides(cfg, layers, str(states)), spec / "capture-server.log"
        ) as base:
            generate(base)
    check_files(out, len(layers), hidden)
    write_text_atomic(done, stamp)  # only now: a failed or interrupted run resumes instead
    return out


def check_files(out: Path, n_layers: int, hidden: int) -> None:
    """The layer count speculators will split (its own --validate-outputs checks tokens, not layers):
    one file's header, enough to catch a server that captures other layers than asked."""
    from safetensors import safe_open

    files = sorted(out.glob("hs_*.safetensors"))
    if not files:
        raise SpeculatorsError(f"{out}: generate-offline-data wrote no hidden states")
    with safe_open(files[0], framework="pt") as f:
        shape = tuple(f.get_slice("hidden_states").get_shape())
    if shape[1:] != (n_layers, hidden):
        raise SpeculatorsError(
            f"{files[0]}: hidden_states {shape}, expected [T, {n_layers}, {hidden}]: the server "
            "captures other layers than HIDDEN_STATES_LAYERS asks (capture.base_url's own?)"
        )
