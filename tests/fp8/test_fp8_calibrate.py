"""Calibration on tiny random models: the captured maxima equal an independent
reference computed here from the modules' weights (own RMSNorm, own rotary in
vLLM's layout), the result's shape, and every bad input refused before a model loads."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kimidflash.errors import KvCaptureError
from kimidflash.formats.kv_scales import KvScales
from kimidflash.fp8 import calibrate as cal
from kimidflash.fp8 import calibrate_cli
from kimidflash.fp8.capture import KvCapture
from kimidflash.paths import REPO_ROOT

from ..support.fp8_models import build

PROMPTS = REPO_ROOT / "payload" / "kv_calibration_prompts.jsonl"
GENERATOR = REPO_ROOT / "scripts" / "make_kv_calibration_prompts.py"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fp8models")
    return {k: build(k, root / k, seed=3) for k in ("mla", "llama")}


# ------------------------------------------------------------- reference
def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rope_pairs(x: torch.Tensor, theta: float) -> torch.Tensor:
    """GPT-J style (adjacent pairs), what vLLM applies to DeepSeek's k_pe."""
    T, d = x.shape
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(d, theta)[None]
    x0, x1 = x[:, 0::2].double(), x[:, 1::2].double()
    out = torch.empty(T, d, dtype=torch.float64)
    out[:, 0::2], out[:, 1::2] = x0 * ang.cos() - x1 * ang.sin(), x1 * ang.cos() + x0 * ang.sin()
    return out


def rope_halves(x: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX style (first half with second half), Llama's layout; x [T, heads, d]."""
    T, _, d = x.shape
    ang = (torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(d, theta)[None])[:, None, :]
    a, b = x[..., : d // 2].double(), x[..., d // 2 :].double()
    return torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()], -1)


def reference(model_dir: Path, mla: bool, token_lists: list[list[int]]) -> list[dict[str, float]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = model.config
    theta = cfg.rope_parameters["rope_theta"]
    out = [dict(latent=0.0, rope=0.0, k=0.0, v=0.0) for _ in model.model.layers]
    with torch.no_grad():
        for ids in token_lists:
            hs = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False).hidden_states
            for i, layer in enumerate(model.model.layers):
                x = rms(hs[i][0], layer.input_layernorm.weight, cfg.rms_norm_eps)
                a = layer.self_attn
                if mla:
                    kv = x @ a.kv_a_proj_with_mqa.weight.T
                    latent = rms(kv[:, : cfg.kv_lora_rank], a.kv_a_layernorm.weight, cfg.rms_norm_eps)
                    k_pe = rope_pairs(kv[:, cfg.kv_lora_rank :], theta)
                    out[i]["latent"] = max(out[i]["latent"], latent.abs().max().item())
                    out[i]["rope"] = max(out[i]["rope"], k_pe.abs().max().item())
                else:
                    hd = cfg.head_dim
                    k = rope_halves((x @ a.k_proj.weight.T).view(len(ids), -1, hd), theta)
                    v = x @ a.v_proj.weight.T
                    out[i]["k"] = max(out[i]["k"], k.abs().max().item())
                    out[i]["v"] = max(out[i]["v"], v.abs().max().item())
    return out


def chosen(n: int = 6, seed: int = 1) -> list[cal.Prompt]:
    return cal.select(cal.load_prompts(PROMPTS), n, seed)


@pytest.mark.parametrize("kind", ["mla", "llama"])
def test_captured_maxima_equal_the_independent_reference(models, kind):
    from transformers import AutoTokenizer

    prompts = chosen()
    mla = kind == "mla"
    scales = cal.calibrate(models[kind], "mla" if mla else "mha", prompts, max_tokens=96, seed=1, dtype="float32")
    tok = AutoTokenizer.from_pretrained(models[kind])
    ids = [cal.encode(tok, p.text, 96) for p in prompts]
    assert scales.tokens == sum(map(len, ids)) and scales.prompts == len(prompts)
    ref = reference(models[kind], mla, ids)
    assert len(scales.layers) == len(ref)
    for ly, r in zip(scales.layers, ref, strict=False):
        if mla:
            assert ly.latent_amax == pytest.approx(r["latent"], rel=1e-5)
            assert ly.rope_amax == pytest.approx(r["rope"], rel=1e-5)
            assert ly.k_amax == max(ly.latent_amax, ly.rope_amax)
        else:
            assert ly.k_amax == pytest.approx(r["k"], rel=1e-5)
            assert ly.v_amax == pytest.approx(r["v"], rel=1e-5)


def test_capture_restores_the_model_and_refuses_a_missed_rope(models, monkeypatch):
    from transformers import AutoModelForCausalLM
    from transformers.models.llama import modeling_llama

    orig = modeling_llama.apply_rotary_pos_emb
    model = AutoModelForCausalLM.from_pretrained(models["llama"], dtype=torch.float32).eval()
    with pytest.raises(RuntimeError, match="boom"), KvCapture(model, mla=False):
        assert modeling_llama.apply_rotary_pos_emb is not orig
        raise RuntimeError("boom")
    assert modeling_llama.apply_rotary_pos_emb is orig
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    # a version that applies rotary elsewhere: the capture never sees a key and says so
    cap = KvCapture(model, mla=False)
    with torch.no_grad(), cap:
        monkeypatch.setattr(cap, "_record_rope", lambda out: None)
        model(torch.tensor([[5, 6, 7]]), use_cache=False)
    with pytest.raises(KvCaptureError, match="layer 0: no rope call was seen"):
        cap.check_complete()


def test_result_json_shape_table_and_portable_provenance(models, tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = calibrate_cli.main(
        [
            str(models["mla"]),
            "--num-prompts",
            "3",
            "--max-tokens",
            "32",
            "--seed",
            "4",
            "-o",
            str(out),
            "--dtype",
            "float32",
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["schema"] == "kimidflash-kv-scales/1" and data["attention"] == "mla"
    assert [d["index"] for d in data["layers"]] == [0, 1, 2]
    assert all({"k_amax", "latent_amax", "rope_amax", "k_scale"} <= set(d) for d in data["layers"])
    prov = data["provenance"]
    assert prov["model_dir"].startswith("$TMPDIR/") and not prov["prompts_file"].startswith("/")
    assert (
        prov["prompts_sha256"] == hashlib.sha256(PROMPTS.read_bytes()).hexdigest()
        and prov["seed"] == 4
        and prov["dtype"] == "float32"
    )
    assert len(prov["prompt_ids"]) == 3 and sum(prov["categories"].values()) == 3
    scales = KvScales.load(out)
    rows = cal.table_rows(scales)
    # a compressed-tensors scale runs as it is: the MI300X overlay's is amax * headroom / 240, not 2x the /448 one
    assert [r["k_scale_fnuz"] / r["k_scale"] for r in rows] == pytest.approx([448 / 240] * 3)
    text = capsys.readouterr().out
    assert "rope amax" in text and "latent amax" in text and "e4m3fnuz" in text


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "payload" / "calibrate_kv_scales.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bad_inputs_fail_fast_with_one_line_and_nothing_written(models, tmp_path):
    out = tmp_path / "o.json"
    no_cfg = tmp_path / "nocfg"
    no_cfg.mkdir()
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"model_type": "gpt2", "num_hidden_layers": 2}))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    m = str(models["llama"])
    cases = [
        ([str(tmp_path / "missing")], "missing: model directory not found"),
        ([str(no_cfg)], "nocfg/config.json"),
        ([str(odd)], "model_type 'gpt2' is not supported"),
        ([m, "--num-prompts", "0"], "--num-prompts 0 is out of range [1, 210]"),
        ([m, "--num-prompts", "211"], "--num-prompts 211 is out of range"),
        ([m, "--max-tokens", "3"], "--max-tokens 3 is out of range"),
        ([m, "--headroom", "0.5"], "--headroom 0.5 is out of range"),
        ([m, "--prompts", str(tmp_path / "none.jsonl")], "none.jsonl: cannot read the prompt set"),
        ([m, "--overlay", str(busy)], "--overlay: " + str(busy) + ": not empty"),
    ]
    for args, msg in cases:
        r = _run([*args, "-o", str(out)])
        err = r.stderr.strip()
        assert r.returncode == 2, (args, r.stderr)
        assert msg in err and len(err.splitlines()) == 1 and err.startswith("kimidflash calibrate: "), (args, err)
        assert not out.exists()
    assert sorted(p.name for p in busy.iterdir()) == ["x"]


def test_the_command_table_runs_calibrate(monkeypatch):
    from kimidflash import cli

    seen = {}
    monkeypatch.setattr(calibrate_cli, "main", lambda argv: seen.setdefault("argv", argv) and 7)
    assert cli.main(["calibrate", "M", "--seed", "3"]) == 7 and seen["argv"] == ["M", "--seed", "3"]


def test_prompt_set_is_generated_diverse_and_seeded():
    r = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    prompts = cal.load_prompts(PROMPTS)
    assert len(prompts) >= 200 and len({p.id for p in prompts}) == len(prompts)
    cats = {p.category for p in prompts}
    assert {"code", "math", "chat", "long"} <= cats
    longs = [p for p in prompts if p.category == "long"]
    assert len(longs) >= 10 and min(len(p.text.split()) for p in longs) >= 1500
    assert cal.select(prompts, 200, 0) == cal.select(prompts, 200, 0) != cal.select(prompts, 200, 1)
    assert {p.category for p in cal.select(prompts, 200, 0)} == cats


def test_device_auto_spreads_the_model_and_measures_the_same(models):
    """--device auto (accelerate's device_map, how a model larger than one GPU runs)
    gives the same maxima as a plain single-device load."""
    prompts = chosen(3, seed=2)
    one = cal.calibrate(models["mla"], "mla", prompts, max_tokens=48, seed=2, dtype="float32", device="cpu")
    auto = cal.calibrate(models["mla"], "mla", prompts, max_tokens=48, seed=2, dtype="float32", device="auto")
    assert auto.layers == one.layers and auto.tokens == one.tokens
    assert auto.provenance["device"] == "cpu"  # where the inputs went: the embeddings' device
