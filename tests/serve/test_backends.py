"""The attention plan per config and pin, and the rule that every shipped patch runs
on a shipped config's path (tests/serve/test_backend_selection.py checks the plan against
vLLM's own selector in the real trees)."""

from __future__ import annotations

import dataclasses

import pytest

from kimidflash import backends, docs_gen
from kimidflash.config import Config, ConfigError, load_config

from ..support.helpers import CONFIGS, DFLASH_PRODUCTION_CONFIGS, EAGLE3_PRODUCTION_CONFIGS, PRODUCTION_CONFIGS


def values(name: str, pin: str, **sets: str) -> Config:
    return load_config(CONFIGS / name, {"VLLM_VERSION": pin, **sets}, environ={})


def test_the_current_pin_is_the_production_configs_pin():
    assert backends.PINS[-1] == values("production.env", backends.PINS[-1]).vllm_version
    assert load_config(CONFIGS / "production.env", environ={}).vllm_version == backends.PINS[-1]


@pytest.mark.parametrize("name", DFLASH_PRODUCTION_CONFIGS)
def test_every_production_config_runs_triton_mla_and_rocm_attn_on_both_pins(name):
    for pin in backends.PINS:
        plan = backends.attention_plan(values(name, pin))
        assert (plan.target, plan.draft) == ("TRITON_MLA", "ROCM_ATTN"), (name, pin, plan)
    assert "speculative_config" in backends.attention_plan(values(name, "0.33.0")).draft_how
    assert "P5" in backends.attention_plan(values(name, "0.20.2")).draft_how


@pytest.mark.parametrize("name", EAGLE3_PRODUCTION_CONFIGS)
def test_every_eagle3_config_runs_the_pins_own_mla_backend_for_its_head_on_the_current_pin_only(name):
    """The head's one MLA layer runs what 0.33.0's ROCm order gives an MLA draft (ROCM_AITER_MLA), named
    per draft, beside the seed's TRITON_MLA target; the legacy pin, where the recipe never read EAGLE-3,
    refuses the config in one line naming VLLM_VERSION."""
    plan = backends.attention_plan(values(name, "0.33.0"))
    assert (plan.target, plan.draft) == ("TRITON_MLA", backends.ROCM_MLA_FIRST) == ("TRITON_MLA", "ROCM_AITER_MLA")
    assert "speculative_config" in plan.draft_how
    assert backends.served_pins("eagle3") == ("0.33.0",)
    with pytest.raises(ConfigError, match="VLLM_VERSION.*0.32.0"):
        values(name, "0.20.2")
    assert backends.exercised(values(name, "0.33.0")) == (["P10", "E1"] if "fp8kv" in name else ["E1"])


def test_an_eagle3_head_takes_a_backend_of_its_own_attention_family():
    mla = dataclasses.replace(values("production-eagle3.env", "0.33.0"), draft_attention_backend="ROCM_ATTN")
    assert backends.refusal(mla)[0] == "DRAFT_ATTENTION_BACKEND" and "MLA" in backends.refusal(mla)[1]
    std = dataclasses.replace(mla, target_attention="standard", draft_attention_backend="TRITON_MLA")
    assert "standard-attention" in backends.refusal(std)[1]
    assert backends.refusal(dataclasses.replace(std, draft_attention_backend="ROCM_ATTN")) is None


def test_patches_run_on_the_pins_and_configs_their_data_says():
    assert backends.exercised(values("production.env", "0.20.2")) == ["P3", "P5"]
    assert backends.exercised(values("production-fp8kv.env", "0.20.2")) == ["P3", "P5", "P10"]
    assert backends.exercised(values("production.env", "0.33.0")) == []
    assert backends.exercised(values("production-fp8kv.env", "0.33.0")) == ["P10"]
    assert (
        backends.exercised(
            values("production.env", "0.20.2", ATTENTION_BACKEND="TRITON_MLA", SPECULATIVE_METHOD="none")
        )
        == []
    )


def test_every_shipped_patch_runs_on_some_production_config_and_pin():
    """A patch that no shipped config exercises does not ship (retire it instead)."""
    patches, retired = backends.load_patch_data()
    ran = {pid for row in docs_gen.map_rows() for pid in row["patches"]}
    assert [p["id"] for p in patches if p["id"] not in ran] == []
    assert not {r["id"] for r in retired} & {p["id"] for p in patches}


@pytest.mark.parametrize(
    "version, per_draft",
    [("0.20.2", False), ("0.20.0", False), ("0.21.0", True), ("0.33.0+rocm700", True), ("0.20", False)],
)
def test_per_draft_option_arrives_in_0_21(version, per_draft):
    assert backends.per_draft_option(version) is per_draft


def test_a_non_mla_target_backend_is_inherited_by_the_draft_before_0_21():
    v = dataclasses.replace(
        values("production.env", "0.20.2"),
        target_attention="standard",
        attention_backend="ROCM_ATTN",
        draft_attention_backend="",
    )
    plan = backends.attention_plan(v)
    assert plan.draft == "ROCM_ATTN" and "inherits" in plan.draft_how
    assert (
        backends.refusal(dataclasses.replace(v, draft_attention_backend="TRITON_ATTN"))[0] == "DRAFT_ATTENTION_BACKEND"
    )


def test_the_backend_map_has_every_production_config_on_both_pins():
    rows = docs_gen.map_rows()
    cpu = [(n, v.vllm_version) for n, v in docs_gen.cpu_paths()]
    capture = [(n, v.vllm_version) for n, v in docs_gen.capture_paths()]
    # the CPU configs a patch runs on: the tiny K2.6 with its EAGLE-3 head (E1) and with DFlash (C1), the
    # reference with its draft schedule (S1, S2)
    assert cpu == [
        ("cpu-kimi-tiny-eagle3.env", "0.32.0"),
        ("cpu-kimi-tiny.env", "0.32.0"),
        ("cpu-reference.env", "0.32.0"),
    ]

    def pins(n):
        return ("0.33.0",) if n in EAGLE3_PRODUCTION_CONFIGS else backends.PINS

    assert [(r["config"], r["pin"]) for r in rows] == [
        (n, p) for n in PRODUCTION_CONFIGS for p in pins(n)
    ] + cpu + capture
    table = docs_gen.backend_map_table()
    for name in PRODUCTION_CONFIGS:
        assert table.count(f"| `{name}` |") == len(pins(name))


def test_a_variant_of_the_other_family_takes_its_own_familys_draft_backend():
    """ab serves an EAGLE-3 head on a DFlash config (and the other way round): the head takes what the
    pin's ROCm order gives an MLA draft, not the DFlash drafter's ROCM_ATTN, and each config keeps its own."""
    dflash, eagle3 = values("production.env", "0.33.0"), values("production-eagle3.env", "0.33.0")
    assert backends.family_draft_backend(dflash, "eagle3") == "ROCM_AITER_MLA"
    assert backends.family_draft_backend(dflash, "dflash") == "ROCM_ATTN"
    assert backends.family_draft_backend(eagle3, "dflash") == "ROCM_ATTN"
    assert backends.family_draft_backend(eagle3, "eagle3") == "ROCM_AITER_MLA"
    for v in (dflash, eagle3):
        for method in ("dflash", "eagle3"):
            assert (
                backends.refusal(
                    dataclasses.replace(
                        v,
                        speculative_method=method,
                        draft_attention_backend=backends.family_draft_backend(v, method),
                    )
                )
                is None
            )
    cpu = values("cpu-kimi-tiny.env", "0.32.0")
    assert (
        backends.family_draft_backend(cpu, "eagle3") == "CPU_MLA" and backends.family_draft_backend(cpu, "dflash") == ""
    )
