"""export: the trained drafter in vLLM's DFlash checkpoint format.

config.json: `architectures: ["DFlashDraftModel"]`, `model_type: qwen3` with
the usual Qwen3 fields (vocab equal to the target's), `block_size`,
`num_target_layers`, `dflash_config: {mask_token_id, target_layer_ids}`, no
`layer_types` (vLLM 0.32's loader would read it as per-layer attention
types). model.safetensors: unprefixed `fc.weight`, `hidden_norm.weight`,
`layers.N.*`, `norm.weight`; the embeddings and LM head are the target's and
are not written. The mask token is a real vocabulary id whose embedding the
drafter learns to read as "unknown slot" (SmolLM2: 16 `<empty_output>`, never
produced in normal text; Kimi: a reserved id, see the Kimi drafter JSON).
A manifest and the loss curve travel with it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

EXPECTED_LAYER_KEYS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")


def vllm_config(shape: dict[str, Any], dtype: str) -> dict[str, Any]:
    cfg = {k: v for k, v in shape.items() if k not in ("training", "layer_types")}
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 1000000.0)
    cfg["rope_theta"] = theta
    cfg.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": theta})
    cfg["torch_dtype"] = dtype
    cfg["architectures"] = ["DFlashDraftModel"]
    cfg["model_type"] = "qwen3"
    return cfg


def expected_tensors(shape: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every exported name and its shape, from the drafter JSON alone."""
    H, nh, nkv = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = shape.get("head_dim") or H // nh
    I = shape["intermediate_size"]
    n = len(shape["dflash_config"]["target_layer_ids"])
    out: dict[str, tuple[int, ...]] = {"fc.weight": (H, n * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    per = {"self_attn.q_proj.weight": (nh * hd, H), "self_attn.k_proj.weight": (nkv * hd, H),
           "self_attn.v_proj.weight": (nkv * hd, H), "self_attn.o_proj.weight": (H, nh * hd),
           "self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,),
           "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I),
           "input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,)}
    for i in range(shape["num_hidden_layers"]):
        for k, s in per.items():
            out[f"layers.{i}.{k}"] = s
    return out


def export_model(state: dict[str, torch.Tensor], shape: dict[str, Any], out: Path, dtype: str = "bfloat16",
                 extra_files: dict[str, bytes] | None = None) -> Path:
    """Write config.json + model.safetensors (+ extras) to `out`, atomically."""
    from safetensors.torch import save_file

    want = expected_tensors(shape)
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        raise ValueError(f"drafter state does not match its shape: missing {missing[:3]}, extra {extra[:3]}, "
                         f"wrong shape {wrong[:3]}")
    td = getattr(torch, dtype)
    tensors = {k: v.detach().to(td).contiguous() for k, v in state.items()}
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-export-", dir=out.parent))
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(vllm_config(shape, dtype), indent=2, sort_keys=True) + "\n")
    for name, data in (extra_files or {}).items():
        (tmp / name).write_bytes(data)
    os.chmod(tmp, 0o755)
    for p in tmp.iterdir():
        os.chmod(p, 0o644)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def loss_curve_png(history: list[dict[str, float]], path: Path, title: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = [h["step"] for h in history]
    loss = [h["loss"] for h in history]
    w = max(1, len(loss) // 50)
    smooth = [sum(loss[max(0, i - w + 1):i + 1]) / len(loss[max(0, i - w + 1):i + 1]) for i in range(len(loss))]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=90)
    ax.plot(steps, loss, lw=0.5, alpha=0.35, label="loss")
    ax.plot(steps, smooth, lw=1.5, label=f"moving mean ({w})")
    ax.set_xlabel("step")
    ax.set_ylabel("weighted CE")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def drafter_readme(cfg: dict[str, Any], manifest: dict[str, Any], st: dict[str, Any], ev: dict[str, Any] | None) -> str:
    """A human summary written from the manifest and eval file only (no number typed by hand)."""
    origin = (manifest.get("target") or {}).get("origin") or {}
    cap = manifest.get("capture", {})
    tr = manifest.get("train", {})
    lines = [f"# {cfg['name']}: a DFlash drafter trained by `./train-drafter.sh`", "",
             f"Target: `{(manifest.get('target') or {}).get('dir')}`" + (f" ({origin.get('note')})" if origin else ""),
             "", f"- drafter shape: `{Path(cfg['drafter_config']).name}`, exported in vLLM's DFlash format",
             f"- data: {cap.get('train_records')} regenerated training records ({cap.get('train_response_tokens')} "
             f"response tokens), {cap.get('heldout_records')} held out; prompts `{cfg['data']['prompts']}` "
             f"(seed {cfg['seed']}), regen sampling {manifest.get('regen', {}).get('sampling')}",
             f"- training: {st['step']} steps of batch {cfg['train']['batch_size']} x {cfg['train']['anchors_per_seq']} "
             f"anchors, block {cfg['train']['block_size']}, gamma {cfg['train']['gamma']}, lr {cfg['train']['lr']}, "
             f"autocast {cfg['train']['autocast']}; loss curve `loss-curve.png`, history `loss-history.json`",
             f"- final mean loss over the last 50 steps: {tr.get('final_loss_mean_last50')}"]
    if ev:
        for k, r in ev["by_k"].items():
            lines.append(f"- offline acceptance at k={k} ({ev.get('split', 'heldout')} split, {r['drafts']} drafts): "
                         f"mean length {r['mean_acceptance_length']}, per position {r['per_position']}")
    lines += ["", "Reproduce (every command run on the run folder, in order, is in `manifest.json` "
              "under `invocations`):", "", "```bash"]
    lines += [" ".join(i["argv"]) for i in manifest.get("invocations", [])]
    lines += ["```", ""]
    return "\n".join(lines)


def export_run(cfg: dict[str, Any], run: Path, log=print) -> Path:
    from .cli import target_info
    from .evaluate import load_checkpoint_model

    if not cfg["export"]["out"]:
        raise ValueError(f"{cfg['_path']}: export.out is not set")
    model, st = load_checkpoint_model(run, target_info(cfg)["model_dir"])
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["exported_from_step"] = st["step"]
    png = run / "loss-curve.png"
    loss_curve_png(st["history"], png, f"{cfg['name']}: {st['step']} steps")
    extras = {"manifest.json": (json.dumps(manifest, indent=2) + "\n").encode()}
    if png.is_file():
        extras["loss-curve.png"] = png.read_bytes()
    ev = run / "eval.json"
    if ev.is_file() and json.loads(ev.read_text()).get("step") == st["step"]:
        extras["offline-acceptance.json"] = ev.read_bytes()  # measured on this very checkpoint
    hist = run / "loss-history.json"
    if hist.is_file():
        extras["loss-history.json"] = hist.read_bytes()
    from .capture import training_records

    held = training_records(cfg, run)[1]
    if held:  # the traffic to A/B the drafter on: prompts it never trained on
        extras["heldout-prompts.jsonl"] = "".join(
            json.dumps({"id": r.id, "prompt": r.prompt}) + "\n" for r in held).encode()
    extras["README.md"] = drafter_readme(cfg, manifest, st, json.loads(ev.read_text()) if "offline-acceptance.json" in extras else None).encode()
    shape = dict(st["shape"])
    if cfg["export"]["block_size"]:
        shape["block_size"] = cfg["export"]["block_size"]  # queries per draft step: serves k <= block_size - 1
    return export_model(model.state_dict(), shape, Path(cfg["export"]["out"]), cfg["export"]["dtype"], extras)
