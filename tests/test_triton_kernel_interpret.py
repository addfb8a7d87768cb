"""Semantics of patches P6/P7: the patched vLLM 0.20.2 Triton unified attention kernel,
run by the Triton interpreter on CPU, against a plain torch attention reference.

Why by path with stand-in modules: vLLM swaps triton for placeholders when no GPU
driver is active, and importing the whole package needs its many dependencies.
The kernel file only needs a handful of names from vllm (listed in _stubs), so we
provide those, point vllm.triton_utils at the real triton, and exec the two files
(kernel + helpers) straight from a patched copy of the real wheel.
"""
from __future__ import annotations

import subprocess
import sys
import types
from enum import IntEnum
from pathlib import Path

import pytest

from tests.triton_interpret import (  # imports triton with TRITON_INTERPRET=1
    assert_interpreted,
    common_stubs,
    load_vllm_files,
    stub_module,
    torch,
)
from tests.vllm_wheels import copy_vllm_package  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    # numpy warns about 0/0 in the interpreter for padded query rows, which are masked
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

ROOT = Path(__file__).resolve().parents[1]
PATCHER = ROOT / "patches" / "patch_dflash_rocm.py"
OPS = "v1/attention/ops"


class _KVQuantMode(IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3


def _stubs() -> dict:
    platform = types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)
    return {
        **common_stubs(),
        "vllm.envs": stub_module("vllm.envs", VLLM_BATCH_INVARIANT=False),
        "vllm.platforms": stub_module("vllm.platforms", current_platform=platform),
        "vllm.v1.kv_cache_interface": stub_module("vllm.v1.kv_cache_interface",
                                                  KVQuantMode=_KVQuantMode),
    }


def load_unified_attention(pkg: Path):
    """unified_attention from the kernel files of the vllm package at ``pkg``."""
    mods = load_vllm_files(pkg, _stubs(), [
        ("vllm.v1.attention.ops.triton_attention_helpers", f"{OPS}/triton_attention_helpers.py"),
        ("vllm.v1.attention.ops.triton_unified_attention", f"{OPS}/triton_unified_attention.py"),
    ])
    return mods["vllm.v1.attention.ops.triton_unified_attention"].unified_attention


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """(original, patched) unified_attention of vLLM 0.20.2 under TRITON_INTERPRET."""
    assert_interpreted()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        orig = copy_vllm_package("0.20.2", tmp_path_factory.mktemp("orig"))
        patched = copy_vllm_package("0.20.2", tmp_path_factory.mktemp("patched"))
        run = subprocess.run([sys.executable, str(PATCHER), "--vllm-root", str(patched)],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        yield load_unified_attention(orig), load_unified_attention(patched)


# (context_len, query_len) per sequence: a fresh prefill, DFlash-like blocks after
# context, a block that crosses page boundaries.
SEQS = [(0, 6), (13, 4), (30, 9)]
HQ, HKV, D, BLOCK = 4, 2, 64, 16


def make_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in SEQS]
    pages = [-(-s // BLOCK) for s in seq_lens]
    num_blocks = sum(pages) + 3
    perm = torch.randperm(num_blocks, generator=g).tolist()
    table = torch.zeros(len(SEQS), max(pages), dtype=torch.int32)
    for i, n in enumerate(pages):
        table[i, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)
    k_cache = torch.randn(num_blocks, BLOCK, HKV, D, generator=g)
    v_cache = torch.randn(num_blocks, BLOCK, HKV, D, generator=g)
    q = torch.randn(sum(q for _, q in SEQS), HQ, D, generator=g)
    cu = torch.tensor([0] + [sum(q for _, q in SEQS[: i + 1]) for i in range(len(SEQS))],
                      dtype=torch.int32)
    return q, k_cache, v_cache, table, cu, torch.tensor(seq_lens, dtype=torch.int32)


def reference(q, k_cache, v_cache, table, causal: bool, scale: float):
    """Plain attention over each sequence's keys gathered through its page table."""
    out, start = [], 0
    for i, (ctx, qlen) in enumerate(SEQS):
        n = ctx + qlen
        slots = torch.arange(n)
        blocks = table[i, slots // BLOCK].long()
        k = k_cache[blocks, slots % BLOCK].repeat_interleave(HQ // HKV, dim=1)  # [n, HQ, D]
        v = v_cache[blocks, slots % BLOCK].repeat_interleave(HQ // HKV, dim=1)
        qi = q[start:start + qlen]
        s = torch.einsum("qhd,khd->hqk", qi, k) * scale
        if causal:
            allowed = slots[None, :] <= (ctx + torch.arange(qlen))[:, None]
            s = s.masked_fill(~allowed[None], float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), v))
        start += qlen
    return torch.cat(out)


def call(fn, batch, causal: bool, scale: float):
    q, k_cache, v_cache, table, cu, seq_lens = batch
    out = torch.full_like(q, float("nan"))
    one = torch.ones(1)
    fn(q=q, k=k_cache, v=v_cache, out=out, cu_seqlens_q=cu,
       max_seqlen_q=max(q for _, q in SEQS), seqused_k=seq_lens,
       max_seqlen_k=int(seq_lens.max()), softmax_scale=scale, causal=causal,
       window_size=(-1, -1), block_table=table, softcap=0, q_descale=None,
       k_descale=one, v_descale=one)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_patched_kernel_matches_torch_reference(kernels, causal):
    _, patched = kernels
    batch = make_batch()
    scale = D ** -0.5
    got = call(patched, batch, causal, scale)
    want = reference(*batch[:4], causal=causal, scale=scale)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_non_causal_differs_from_causal_and_original_refuses_it(kernels):
    """Guards the test itself: the two references differ on this batch, and the
    unpatched kernel refuses causal=False (the reason for P6/P7)."""
    orig, patched = kernels
    batch = make_batch(1)
    scale = D ** -0.5
    assert not torch.allclose(reference(*batch[:4], causal=True, scale=scale),
                              reference(*batch[:4], causal=False, scale=scale), atol=1e-3)
    with pytest.raises(AssertionError, match="Only causal"):
        call(orig, batch, False, scale)
    # with causal=True the patched kernel computes exactly what upstream computes
    assert torch.equal(call(orig, batch, True, scale), call(patched, batch, True, scale))


def test_non_causal_with_sliding_window_is_refused(kernels):
    _, patched = kernels
    q, k_cache, v_cache, table, cu, seq_lens = make_batch()
    with pytest.raises(AssertionError, match="sliding window"):
        patched(q=q, k=k_cache, v=v_cache, out=torch.empty_like(q), cu_seqlens_q=cu,
                max_seqlen_q=9, seqused_k=seq_lens, max_seqlen_k=39, softmax_scale=0.1,
                causal=False, window_size=(7, 0), block_table=table, softcap=0,
                q_descale=None, k_descale=torch.ones(1), v_descale=torch.ones(1))

