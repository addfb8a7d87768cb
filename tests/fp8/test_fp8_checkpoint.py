"""The KV-scale overlay and its verifier on fake checkpoints (real safetensors files).

A stock loader (safetensors.safe_open) must read what the stdlib writer wrote, the
index must still list every original tensor, and every refusal names its culprit."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kimidflash.formats.kv_scales import KvScales, LayerScale
from kimidflash.fp8 import checkpoint as ck
from kimidflash.fp8.checkpoint import CheckpointError, verify, write_overlay
from kimidflash.safetensors_io import encode_f32_scalars, read_scalar

INT4_QUANT = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}},
    "ignore": ["lm_head", "re:.*self_attn.*"],
}


def mha_scales(n: int, k0: float = 3.0) -> KvScales:
    return KvScales("mha", tuple(LayerScale(i, k_amax=k0 + i, v_amax=0.5 + i) for i in range(n)), 1.25, 100, 2)


def mla_scales(n: int) -> KvScales:
    return KvScales(
        "mla",
        tuple(LayerScale(i, k_amax=max(2.0 + i, 7.0), latent_amax=2.0 + i, rope_amax=7.0) for i in range(n)),
        1.25,
        100,
        2,
    )


def make_checkpoint(
    root: Path,
    layers: int = 2,
    mla: bool = False,
    shards: int = 1,
    prefix: str = "model.",
    quant: dict | None = None,
    text_nested: bool = False,
) -> tuple[Path, dict[str, str]]:
    """A checkpoint with real safetensors shards and, when sharded, an index."""
    root.mkdir(parents=True)
    tensors = {f"{prefix}embed_tokens.weight": torch.ones(4, 2), "lm_head.weight": torch.ones(4, 2)}
    for i in range(layers):
        names = ["kv_a_layernorm.weight", "kv_a_proj_with_mqa.weight"] if mla else ["k_proj.weight", "v_proj.weight"]
        for n in names:
            tensors[f"{prefix}layers.{i}.self_attn.{n}"] = torch.full((2, 2), float(i))
    cfg: dict = {"num_hidden_layers": layers, "model_type": "deepseek_v3" if mla else "llama"}
    if mla:
        cfg["kv_lora_rank"] = 512
    if text_nested:
        cfg = {"model_type": "kimi_k25", "text_config": cfg}
    if quant is not None:
        cfg["quantization_config"] = quant
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer.json").write_text("{}")
    (root / "sub").mkdir()
    (root / "sub" / "x.py").write_text("# code\n")
    names = sorted(tensors)
    wm = {}
    if shards == 1:
        save_file(tensors, str(root / "model.safetensors"))
        wm = {n: "model.safetensors" for n in names}
    else:
        for s in range(shards):
            part = {n: tensors[n] for n in names[s::shards]}
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_file(part, str(root / fname))
            wm.update({n: fname for n in part})
        (root / ck.INDEX).write_text(json.dumps({"metadata": {"total_size": 1234}, "weight_map": wm}))
    return root, wm


def test_stdlib_writer_is_read_by_the_stock_loader(tmp_path):
    vals = {"a.k_scale": 0.0123, "b.v_scale": 3.5}
    p = tmp_path / "s.safetensors"
    p.write_bytes(encode_f32_scalars(vals, {"why": "test"}))
    with safe_open(str(p), framework="pt") as f:
        assert set(f.keys()) == set(vals)
        assert f.metadata() == {"why": "test"}
        for name, want in vals.items():
            t = f.get_tensor(name)
            assert t.dtype == torch.float32 and list(t.shape) == [1]
            assert math.isclose(t.item(), want, rel_tol=1e-6)
            assert math.isclose(read_scalar(p, name), want, rel_tol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_stdlib_reader_reads_scalars_the_stock_writer_wrote(tmp_path, dtype):
    p = tmp_path / "w.safetensors"
    save_file({"x": torch.tensor([0.375], dtype=dtype), "y": torch.tensor(2.5, dtype=dtype)}, str(p))
    assert read_scalar(p, "x") == 0.375 and read_scalar(p, "y") == 2.5


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("mla", [False, True])
def test_overlay_links_every_file_and_indexes_every_tensor(tmp_path, shards, mla):
    src, wm = make_checkpoint(tmp_path / "models" / "m", layers=3, mla=mla, shards=shards)
    scales = mla_scales(3) if mla else mha_scales(3)
    out = write_overlay(src, scales, tmp_path / "models" / "m-kv", fmt="e4m3fn")
    entries = {p.name for p in out.iterdir()}
    originals = {p.name for p in src.iterdir()} - {ck.INDEX}
    assert entries == originals | {ck.SHARD, ck.INDEX}
    for name in originals - {"config.json"}:
        link = out / name
        assert link.is_symlink() and not os.path.isabs(os.readlink(link)), name
        assert link.resolve() == (src / name).resolve()
    assert not (out / "config.json").is_symlink()
    index = json.loads((out / ck.INDEX).read_text())["weight_map"]
    for name, shard in wm.items():
        assert index[name] == shard
    new = {n for n, f in index.items() if f == ck.SHARD}
    want = {n for i in range(3) for n in ck.scale_names("model.", i, mla)}
    assert new == want
    with safe_open(str(out / ck.SHARD), framework="pt") as f:
        for i, (k, v) in enumerate(scales.checkpoint_scales()):
            kn, vn = ck.scale_names("model.", i, mla)
            assert math.isclose(f.get_tensor(kn).item(), k, rel_tol=1e-6)
            assert math.isclose(f.get_tensor(vn).item(), k if mla else v, rel_tol=1e-6)
    # the stock loader reads every tensor the new index names, through the links
    for name, shard in index.items():
        with safe_open(str(out / shard), framework="pt") as f:
            assert name in f.keys()  # noqa: SIM118 (safe_open has keys() but is neither iterable nor a container)
    if not mla:
        report = verify(out)
        assert report.layers == 3 and len(report.k_scales) == 3 and len(report.v_scales) == 3
        assert [round(k, 7) for k in report.k_scales] == [round(k, 7) for k, _ in scales.checkpoint_scales()]


def test_mla_names_are_the_ones_vllm_remaps_onto_mla_attn():
    # maybe_remap_kv_scale_name: \.self_attn\.([kv])_proj\.([kv])_scale$ -> .self_attn.mla_attn.mla_attn.\2_scale;
    # plain .self_attn.k_scale would become .self_attn.attn.k_scale, which an MLA model does not have.
    assert ck.scale_names("language_model.model.", 5, True) == (
        "language_model.model.layers.5.self_attn.k_proj.k_scale",
        "language_model.model.layers.5.self_attn.v_proj.v_scale",
    )
    assert ck.scale_names("model.", 0, False) == (
        "model.layers.0.self_attn.k_scale",
        "model.layers.0.self_attn.v_scale",
    )


def test_config_without_quantization_gets_a_kv_only_compressed_tensors_config(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m")
    out = write_overlay(src, mha_scales(2), tmp_path / "m-kv")
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q == {
        "quant_method": "compressed-tensors",
        "config_groups": {},
        "ignore": [],
        "kv_cache_scheme": ck.KV_CACHE_SCHEME,
    }
    assert json.loads((src / "config.json").read_text()).get("quantization_config") is None


def test_int4_compressed_tensors_config_keeps_its_groups_and_gains_the_kv_scheme(tmp_path):
    src, _ = make_checkpoint(
        tmp_path / "m", mla=True, quant=INT4_QUANT, text_nested=True, prefix="language_model.model."
    )
    out = write_overlay(src, mla_scales(2), tmp_path / "m-kv")
    cfg = json.loads((out / "config.json").read_text())
    q = cfg["quantization_config"]
    assert {k: v for k, v in q.items() if k != "kv_cache_scheme"} == INT4_QUANT
    assert q["kv_cache_scheme"] == ck.KV_CACHE_SCHEME
    assert cfg["text_config"]["kv_lora_rank"] == 512
    index = json.loads((out / ck.INDEX).read_text())["weight_map"]
    assert "language_model.model.layers.1.self_attn.k_proj.k_scale" in index


def test_existing_matching_kv_scheme_is_kept(tmp_path):
    q = {**INT4_QUANT, "kv_cache_scheme": dict(ck.KV_CACHE_SCHEME)}
    assert ck.merged_quant_config({"quantization_config": q}, "c") == q


@pytest.mark.parametrize(
    "quant, match",
    [
        ({"quant_method": "fp8"}, "quant_method='fp8'; only compressed-tensors"),
        ({**INT4_QUANT, "kv_cache_scheme": {**ck.KV_CACHE_SCHEME, "strategy": "attn_head"}}, "strategy='attn_head'"),
        ("x", "not an object"),
    ],
)
def test_other_quant_configs_are_refused(tmp_path, quant, match):
    src, _ = make_checkpoint(tmp_path / "m", quant=quant)
    with pytest.raises(CheckpointError, match=match):
        write_overlay(src, mha_scales(2), tmp_path / "m-kv")
    assert not (tmp_path / "m-kv").exists()


def test_layer_count_and_attention_kind_must_match(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m", layers=2)
    with pytest.raises(CheckpointError, match=r"num_hidden_layers=2, the scales have 3 layers"):
        write_overlay(src, mha_scales(3), tmp_path / "m-kv")
    with pytest.raises(CheckpointError, match="the model is MHA but the scales were measured as mla"):
        write_overlay(src, mla_scales(2), tmp_path / "m-kv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_non_empty_out_dir_is_refused_unless_forced(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m")
    out = tmp_path / "m-kv"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(CheckpointError, match="not empty; pass force"):
        write_overlay(src, mha_scales(2), out)
    assert (out / "keep").exists()
    write_overlay(src, mha_scales(2, k0=9.0), out, force=True)
    assert not (out / "keep").exists()
    assert math.isclose(verify(out).k_scales[0], 9.0 * 1.25 / 240, rel_tol=1e-6)  # default: MI300X's e4m3fnuz
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "m-kv"]  # no temp or trash left


def test_empty_out_dir_is_used(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m")
    (tmp_path / "m-kv").mkdir()
    assert verify(write_overlay(src, mha_scales(2), tmp_path / "m-kv")).layers == 2


def test_a_failure_while_building_leaves_no_out_dir(tmp_path, monkeypatch):
    src, _ = make_checkpoint(tmp_path / "m")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "write_f32_scalars", boom)
    with pytest.raises(OSError, match="No space left"):
        write_overlay(src, mha_scales(2), tmp_path / "m-kv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_checkpoint_that_already_has_kv_scales_is_refused(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m")
    save_file({"model.layers.0.self_attn.k_scale": torch.tensor([0.1])}, str(src / "extra.safetensors"))
    with pytest.raises(CheckpointError, match="already carries KV scale tensors"):
        write_overlay(src, mha_scales(2), tmp_path / "m-kv")


# ------------------------------------------------------------------ verify
def _overlay_with(tmp_path: Path, edit) -> Path:
    """An MHA overlay whose scale shard is rewritten by ``edit(tensors)``."""
    src, _ = make_checkpoint(tmp_path / "m", layers=3)
    out = write_overlay(src, mha_scales(3), tmp_path / "m-kv")
    with safe_open(str(out / ck.SHARD), framework="pt") as f:
        tensors = {n: f.get_tensor(n).item() for n in f.keys()}  # noqa: SIM118 (safe_open has keys() but is neither iterable nor a container)
    edit(tensors)
    (out / ck.SHARD).write_bytes(encode_f32_scalars(tensors))
    return out


@pytest.mark.parametrize("value, shown", [(float("nan"), "nan"), (0.0, "0.0"), (-0.5, "-0.5"), (float("inf"), "inf")])
def test_verify_refuses_a_bad_value_naming_file_layer_and_tensor(tmp_path, value, shown):
    out = _overlay_with(tmp_path, lambda t: t.__setitem__("model.layers.1.self_attn.v_scale", value))
    with pytest.raises(CheckpointError) as exc:
        verify(out)
    msg = str(exc.value)
    assert str(out / ck.SHARD) in msg and "layer 1" in msg and "model.layers.1.self_attn.v_scale" in msg
    assert f"= {shown}" in msg and "\n" not in msg


def test_verify_refuses_a_missing_layer(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m", layers=3)
    out = write_overlay(src, mha_scales(3), tmp_path / "m-kv")
    index = json.loads((out / ck.INDEX).read_text())
    del index["weight_map"]["model.layers.2.self_attn.k_scale"]
    (out / ck.INDEX).write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"layer 2 has no k_scale tensor \(expected model.layers.2.self_attn.k_scale\)"
    ):
        verify(out)


def test_verify_refuses_an_index_naming_a_tensor_its_shard_lacks(tmp_path):
    out = _overlay_with(tmp_path, lambda t: t.pop("model.layers.0.self_attn.k_scale"))
    with pytest.raises(
        CheckpointError, match=r"layer 0: .*kv-scales.safetensors: has no tensor model.layers.0.self_attn.k_scale"
    ):
        verify(out)


def test_verify_refuses_no_quant_config_and_no_kv_scheme(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m")
    with pytest.raises(CheckpointError, match=r"config.json: no quantization_config, so vLLM creates no k_scale"):
        verify(src)
    src2, _ = make_checkpoint(tmp_path / "q", quant=INT4_QUANT)
    with pytest.raises(CheckpointError, match="kv_cache_scheme missing"):
        verify(src2)
    src3, _ = make_checkpoint(tmp_path / "f", quant={"quant_method": "fp8"})
    with pytest.raises(CheckpointError, match="quant_method='fp8'"):
        verify(src3)


def test_verify_refuses_mla_on_stock_vllm_and_accepts_it_when_vllm_loads_it(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m", mla=True, layers=2)
    out = write_overlay(src, mla_scales(2), tmp_path / "m-kv")
    with pytest.raises(CheckpointError, match="MLA model: stock vLLM .* creates no KV scale parameters for MLA"):
        verify(out)
    report = verify(out, vllm_loads_mla_scales=True)
    assert report.attention == "mla" and report.v_scales == () and report.fp8_format == "e4m3fnuz"
    assert [round(k, 7) for k in report.k_scales] == [round(k, 7) for k, _ in mla_scales(2).scales_for("e4m3fnuz")]


@pytest.mark.parametrize("fmt, fp8_max", [("e4m3fnuz", 240.0), ("e4m3fn", 448.0)])
def test_overlay_scales_are_for_the_serving_platforms_format(tmp_path, fmt, fp8_max):
    """vLLM's compressed-tensors KV method uses the scale as it is (no e4m3fnuz doubling),
    so the overlay maps amax * headroom onto the serving format's own maximum."""
    src, _ = make_checkpoint(tmp_path / "m", layers=2)
    report = verify(write_overlay(src, mha_scales(2), tmp_path / "m-kv", fmt=fmt))
    assert report.fp8_format == fmt and f"for {fmt}" in report.summary()
    assert list(report.k_scales) == pytest.approx([(3.0 + i) * 1.25 / fp8_max for i in range(2)], rel=1e-6)
    assert list(report.v_scales) == pytest.approx([(0.5 + i) * 1.25 / fp8_max for i in range(2)], rel=1e-6)
    with pytest.raises(CheckpointError, match="fmt 'e5m2'"):
        write_overlay(src, mha_scales(2), tmp_path / "other", fmt="e5m2")


def test_verify_reads_bf16_scales_written_by_another_tool(tmp_path):
    src, _ = make_checkpoint(
        tmp_path / "m", layers=1, quant={**INT4_QUANT, "kv_cache_scheme": dict(ck.KV_CACHE_SCHEME)}
    )
    save_file(
        {
            "model.layers.0.self_attn.k_scale": torch.tensor(0.25, dtype=torch.bfloat16),
            "model.layers.0.self_attn.v_scale": torch.tensor(0.5, dtype=torch.bfloat16),
        },
        str(src / "s.safetensors"),
    )
    index = {
        "weight_map": {
            "model.layers.0.self_attn.k_scale": "s.safetensors",
            "model.layers.0.self_attn.v_scale": "s.safetensors",
        }
    }
    (src / ck.INDEX).write_text(json.dumps(index))
    r = verify(src)
    assert r.k_scales == (0.25,) and r.v_scales == (0.5,)


def test_truncated_shard_is_one_clear_error(tmp_path):
    out = _overlay_with(tmp_path, lambda t: None)
    data = (out / ck.SHARD).read_bytes()
    (out / ck.SHARD).write_bytes(data[:-3])
    with pytest.raises(CheckpointError, match=r"layer \d: .*is truncated"):
        verify(out)
    (out / ck.SHARD).write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(CheckpointError, match="header length .* not plausible"):
        verify(out)


def test_links_resolve_when_the_models_folder_is_reached_through_a_symlink(tmp_path):
    real = tmp_path / "mnt" / "models"
    src, _ = make_checkpoint(real / "m")
    (tmp_path / "models").symlink_to(real)
    out = write_overlay(tmp_path / "models" / "m", mha_scales(2), tmp_path / "models" / "m-kv")
    for name in ("model.safetensors", "tokenizer.json", "sub"):
        assert (out / name).exists(), name
        assert os.readlink(out / name) == f"../m/{name}"
    # the same relative links resolve wherever the folder is mounted (a container's /models)
    moved = tmp_path / "elsewhere"
    os.rename(real, moved)
    assert (moved / "m-kv" / "model.safetensors").resolve() == (moved / "m" / "model.safetensors")
    assert verify(moved / "m-kv").layers == 2


def test_a_modelopt_checkpoint_with_a_separate_quant_file_is_refused(tmp_path):
    src, _ = make_checkpoint(tmp_path / "m")
    (src / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    with pytest.raises(CheckpointError, match="hf_quant_config.json: a ModelOpt checkpoint"):
        write_overlay(src, mha_scales(2), tmp_path / "m-kv")
    assert not (tmp_path / "m-kv").exists()
