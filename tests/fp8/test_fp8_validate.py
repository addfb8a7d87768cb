"""validate-fp8 without servers: bad input is refused (exit 2, one line naming the
culprit, nothing written), the verdict follows the gate, and the report and JSONs
are written whole, portable, and from the document alone."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from kimidflash.fp8 import report, validate
from kimidflash.fp8.requests import Output
from kimidflash.paths import REPO_ROOT

from ..support.helpers import CONFIGS, command

FP8_SETS = ["--set", "KV_CACHE_DTYPE=fp8", "--set", "KV_SCALE_POLICY=checkpoint", "--set", "DRAFT_KV_CACHE_DTYPE=fp8"]


@pytest.mark.parametrize(
    "argv, culprit",
    [
        ([str(CONFIGS / "cpu-reference.env")], "KV_CACHE_DTYPE=auto is not an FP8 KV cache"),
        (
            [str(CONFIGS / "cpu-reference.env"), *FP8_SETS, "--set", "KV_CACHE_DTYPEE=fp8"],
            "KV_CACHE_DTYPEE (--set): unknown key",
        ),
        ([str(CONFIGS / "cpu-reference.env"), "--set", "KV_CACHE_DTYPE=fp8"], "KV_SCALE_POLICY"),
        ([str(CONFIGS / "cpu-reference.env"), *FP8_SETS, "--set", "NOEQUALS"], "NOEQUALS (--set): expected KEY=VALUE"),
        ([str(CONFIGS / "nope.env"), *FP8_SETS], "config"),
        ([str(CONFIGS / "cpu-reference.env"), *FP8_SETS, "--prompts", "0"], "--prompts must be 1..36, got 0"),
        ([str(CONFIGS / "cpu-reference.env"), *FP8_SETS, "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (
            [str(CONFIGS / "cpu-reference.env"), *FP8_SETS, "--min-agreement", "1.5"],
            "--min-agreement must be within [0, 1]",
        ),
        ([str(CONFIGS / "cpu-reference.env"), *FP8_SETS, "--top-k", "21"], "--top-k must be 1..20"),
        (
            [str(CONFIGS / "cpu-reference.env"), *FP8_SETS, "--reference-model", "/nonexistent"],
            "--reference-model /nonexistent",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(argv, culprit, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert command("validate-fp8", [*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert culprit in err and len(err.splitlines()) == 1, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_cli_table_routes_validate_fp8(tmp_path, capsys) -> None:
    from kimidflash.cli import main

    assert main(["validate-fp8", str(CONFIGS / "cpu-reference.env"), "--out", str(tmp_path / "o")]) == 2
    assert "not an FP8 KV cache" in capsys.readouterr().err


def test_shipped_prompts_are_diverse_and_disjoint_from_calibration() -> None:
    val = validate.shipped_prompts()
    assert 24 <= len(val) <= 60 and len({pid for pid, _ in val}) == len(val)
    kinds = {
        json.loads(line)["kind"]
        for line in (REPO_ROOT / "src/kimidflash/fp8/data/validation_prompts.jsonl").read_text().splitlines()
        if line
    }
    assert len(kinds) >= 8
    norm = lambda s: re.sub(r"\s+", " ", s.lower()).strip()  # noqa: E731
    cal = [
        norm(json.loads(line)["prompt"])
        for line in (REPO_ROOT / "payload/kv_calibration_prompts.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert len(cal) >= 100
    for pid, text in val:
        t = norm(text)
        assert not any(t in c or c in t for c in cal), f"validation prompt {pid} overlaps the calibration set"


def test_overlay_source_finds_the_linked_checkpoint(tmp_path) -> None:
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"x")
    ov = tmp_path / "model-kv"
    ov.mkdir()
    os.symlink("../model/model.safetensors", ov / "model.safetensors")
    (ov / "config.json").write_text(json.dumps({"quantization_config": {"kv_cache_scheme": {"num_bits": 8}}}))
    assert validate.overlay_source(ov) == src.resolve()
    assert validate.overlay_source(src) is None  # a plain checkpoint is its own reference
    os.symlink(str(tmp_path), ov / "elsewhere")
    with pytest.raises(validate.InputError, match="--reference-model"):
        validate.overlay_source(ov)


# ------------------------------------------------------------- verdict + files
def _opts(tmp_path: Path, min_agreement: float = 0.9) -> validate.Options:
    return validate.Options(
        str(CONFIGS / "cpu-reference.env"),
        {"KV_CACHE_DTYPE": "fp8", "KV_SCALE_POLICY": "checkpoint", "DRAFT_KV_CACHE_DTYPE": "fp8"},
        2,
        8,
        min_agreement,
        tmp_path / "bench" / "fp8" / "case",
        None,
        20,
        2,
        None,
        ("validate-fp8.sh", str(CONFIGS / "cpu-reference.env")),
    )


def _server(label: str, outputs: list[Output], scored, tps: float, kv_log: bool) -> dict:
    over = {
        "KV_CACHE_DTYPE": "fp8" if kv_log else "auto",
        "KV_SCALE_POLICY": "checkpoint" if kv_log else "none",
        "DRAFT_KV_CACHE_DTYPE": "fp8" if kv_log else "",
        "MODEL_DIR": str(REPO_ROOT / "drafters" / "x"),
    }
    return {
        "label": label,
        "overrides": over,
        "outputs": outputs,
        "scored": scored,
        "bench": {"output_throughput": tps, "spec_decode_acceptance_length": 1.0},
        "start_seconds": 30.0,
        "fp8_log": ["Using fp8 data type to store kv cache."] if kv_log else [],
        "kv_cache_tokens": 87360 if kv_log else 21824,
    }


def _pos(top: int, p: float = 0.9) -> dict[int, float]:
    import math

    return {top: math.log(p), 999: math.log(1 - p - 0.01)}


def _case(fp8_tokens: list[int], fp8_text: str, fp8_tops: list[int]):
    ref_out = [
        Output("v01", "one two three four", (1, 2), (10, 11, 12, 13), "length"),
        Output("v02", "five six", (1, 3), (20, 21), "stop"),
    ]
    ref_scored = [[_pos(t) for t in (10, 11, 12, 13)], [_pos(t) for t in (20, 21)]]
    fp8_out = [Output("v01", fp8_text, (1, 2), tuple(fp8_tokens), "length"), ref_out[1]]
    fp8_scored = [[_pos(t) for t in fp8_tops], ref_scored[1]]
    return (_server("auto-kv", ref_out, ref_scored, 20.0, False), _server("fp8-kv", fp8_out, fp8_scored, 19.0, True))


def test_a_close_fp8_run_passes_and_its_files_are_whole_and_portable(tmp_path) -> None:
    opts = _opts(tmp_path)
    ref, fp8 = _case([10, 11, 12, 99], "one two three nine", [10, 11, 12, 13])
    doc = validate.evaluate(opts, ref, fp8)
    assert doc["passed"] and doc["reasons"] == []
    assert doc["token_agreement"] == {"identical": 1, "identical_share": 0.5, "mean_matched_prefix": 0.875}
    assert doc["teacher_forced"]["top1_agreement"] == 1.0 and doc["teacher_forced"]["positions"] == 6
    assert doc["teacher_forced"]["reference_self_top1"] == 1.0
    assert doc["per_prompt"][0]["first_divergence"] == 3 and doc["per_prompt"][1]["first_divergence"] is None
    assert doc["throughput"]["ratio"] == pytest.approx(0.95)
    doc["provenance"] = {"tool": "kimidflash.fp8.validate", "command": "validate-fp8.sh configs/cpu-reference.env"}
    out = validate.write_outputs(opts.out, doc, ref["bench"], fp8["bench"])
    assert sorted(p.name for p in out.iterdir()) == [
        "bench-fp8.json",
        "bench-reference.json",
        "report.md",
        "validation.json",
    ]
    assert json.loads((out / "validation.json").read_text()) == json.loads(json.dumps(doc))
    md = (out / "report.md").read_text()
    assert md == report.render(doc) and "**PASS**" in md and "| v01 | 3 | 0.750 | 4 / 4 |" in md
    assert "| 87,360 |" in md and "| 21,824 |" in md  # each server's KV capacity, from vLLM's log
    for f in out.iterdir():
        text = f.read_text()
        assert str(REPO_ROOT) not in text and str(tmp_path) not in text, f.name
    assert [p.name for p in out.parent.iterdir()] == ["case"]  # no temp dirs left beside it


def test_kv_capacity_is_read_from_vllms_log_line():
    line = (
        "(EngineCore pid=1) INFO 11-23 [kv_cache_utils.py:2328] CPU KV cache size: 87,360 tokens, Maximum concurrency"
    )
    assert int(validate.KV_TOKENS.search(line).group(1).replace(",", "")) == 87360
    assert validate.KV_TOKENS.search("GPU KV cache size: 2,469,568 tokens, ...").group(1) == "2,469,568"


def test_low_agreement_and_a_degenerate_output_fail_with_reasons(tmp_path) -> None:
    ref, fp8 = _case([7] * 40, "-" * 40, [10, 7, 7, 7])
    doc = validate.evaluate(_opts(tmp_path), ref, fp8)
    assert not doc["passed"]
    assert doc["reasons"][0] == "teacher-forced top-1 agreement 0.500 < 0.9"
    assert doc["reasons"][1].startswith("1 FP8 output(s) degenerate where the reference's do not (first: v01: ")
    md = report.render(doc)
    assert md.startswith("# FP8 KV validation\n\n**FAIL**: teacher-forced top-1 agreement 0.500 < 0.9")
    assert "| repetition_loop, repeated_ngram, token_collapse, symbol_soup (a 1-token unit repeats 40 times" in md


def test_a_reference_with_an_fp8_cache_is_no_reference(tmp_path) -> None:
    ref, fp8 = _case([10, 11, 12, 13], "one two three four", [10, 11, 12, 13])
    ref["fp8_log"] = ["Using fp8 data type to store kv cache."]
    fp8["fp8_log"] = []
    doc = validate.evaluate(_opts(tmp_path), ref, fp8)
    assert not doc["passed"] and len(doc["reasons"]) == 2
    assert "it is no BF16-KV reference" in doc["reasons"][0] and "did not store an FP8 KV cache" in doc["reasons"][1]


def test_a_failed_write_leaves_the_previous_result_untouched(tmp_path, monkeypatch) -> None:
    opts = _opts(tmp_path)
    ref, fp8 = _case([10, 11, 12, 13], "one two three four", [10, 11, 12, 13])
    doc = validate.evaluate(opts, ref, fp8)
    validate.write_outputs(opts.out, doc, ref["bench"], fp8["bench"])
    before = {p.name: p.read_bytes() for p in opts.out.iterdir()}

    def boom(_doc):
        raise OSError("disk full")

    monkeypatch.setattr(report, "render", boom)
    with pytest.raises(OSError):
        validate.write_outputs(opts.out, {**doc, "passed": False}, ref["bench"], fp8["bench"])
    assert {p.name: p.read_bytes() for p in opts.out.iterdir()} == before
    assert [p.name for p in opts.out.parent.iterdir()] == ["case"]
