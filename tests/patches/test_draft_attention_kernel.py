"""The DFlash draft's real attention path on MI300X, checked for meaning.

On ROCm the non-causal DFlash draft (standard attention, head size 128) gets
ROCM_ATTN (``v1/attention/backends/rocm_attn.py``) first: on the patched 0.20.2
with vLLM's selector posed as MI300X, and first in 0.33.0's ROCm priority list
(``platforms/rocm.py``). Its ``forward`` calls ``chunked_prefill_paged_decode`` with
``causal=attn_metadata.causal``, which DFlash sets to False. A draft step queries
1 + k positions per request (the bonus token and k mask tokens) against the
context K/V that ``precompute_and_store_context_kv`` wrote into the paged cache
beforehand; the draft never attends over its context as queries. So every draft
batch has ``max_query_len = 1 + k > 1`` and takes:

- ``context_attention_fwd`` (``v1/attention/ops/prefix_prefill.py``, Triton
  ``_fwd_kernel``): context keys read from the paged cache (dequantised with the
  per-tensor k/v scale for an FP8 cache), the 1 + k block keys from the dense
  key/value tensors, ``CAUSAL`` as passed;
- then the decode branch for single-token requests, which the draft batch has
  none of: on MI300X (gfx942) with a bfloat16 query, head 128, block 16 and a
  GQA ratio up to 16 vLLM's own decision picks the ROCm custom op
  ``ops.paged_attention_rocm`` (HIP, cannot run here; its source returns early
  for requests whose query length is not 1), otherwise the Triton
  ``kernel_paged_attention_2d`` (``filter_by_query_len=True``: it returns early
  for those requests too).

This test executes those two files from each release's wheel, copied and patched
with ``patches/patch_dflash_rocm.py`` as production images are (the patch set
does not touch them; checked below), under the Triton interpreter on CPU, with
vLLM's platform posed as MI300X (FP8 = e4m3fnuz, vLLM's own custom-op decision
with gfx9 on). The ROCm custom op is a recording stand-in that writes nothing.
Each draft batch (several requests with different context lengths, paged KV
with block size 16 and shuffled physical blocks, GQA, head size 128, queries of
1 + k tokens for k = 2 and 8) is compared with a plain torch reference, causal
and non-causal, for a bfloat16-valued cache and an FP8 cache.

Precision: the interpreter cannot compute on bfloat16 (tests/support/triton_interpret.py),
so tensors are float32 holding bfloat16-representable values, the "bf16" cache
has the bfloat16 geometry (key vectors of x = 8 elements, as split_kv_cache views
a 2-byte cache) and everything is computed in float32; the FP8 cache is real
float8_e4m3fnuz (x = 16).

Not covered here: the HIP pieces (the custom decode op, ``reshape_and_cache``
and AITER's fused rope + cache write that fill the cache), the kernel compiled
for gfx942 (bfloat16 MFMA, and the dequantised FP8 keys rounded to the bfloat16
query dtype by ``.to(q.dtype)``), and 0.33.0's interleaved V cache (used only
when the compile-time qk-norm/rope/cache fusion pass is on).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.triton_interpret import (  # imports triton with TRITON_INTERPRET=1
    assert_interpreted,
    common_stubs,
    function_from_source,
    load_vllm_files,
    stub_module,
    torch,
    vllm_stubs_installed,
)
from tests.support.vllm_wheels import copy_vllm_package, vllm_tree

pytestmark = [
    pytest.mark.slow,
    # numpy warns about 0/0 in the interpreter for padded query rows, which are masked
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
PATCHER = ROOT / "patches" / "patch_dflash_rocm.py"
VERSIONS = ["0.20.2", "0.33.0"]
BACKEND = "v1/attention/backends/rocm_attn.py"
PREFIX_PREFILL = "v1/attention/ops/prefix_prefill.py"
CHUNKED = "v1/attention/ops/chunked_prefill_paged_decode.py"
DRAFT_PATH_FILES = [BACKEND, CHUNKED, PREFIX_PREFILL, "v1/attention/ops/paged_attn.py"]
# what rocm_attn.py passes as sliding_window when the layer has none:
# 0.20.2 the FlashAttention-style left span (-1), 0.33.0 the window length (0)
NO_WINDOW = {"0.20.2": -1, "0.33.0": 0}

HQ, HKV, D, BLOCK = 4, 2, 128, 16
# context lengths of the requests in one draft batch: a single token, exactly one
# page, a partial 32-token context tile across a page boundary, one full tile and
# a partial one (the kernel's unmasked and masked cache loads)
CONTEXTS = [1, 16, 29, 47]
CACHES = ["bf16", "fp8"]
FP8 = torch.float8_e4m3fnuz  # vLLM's fp8_dtype() on gfx942
X = {"bf16": 8, "fp8": 16}  # 16 // element size of the production cache dtype
# e4m3 keeps 3 mantissa bits (relative rounding up to 2**-4); measured about 0.02
FP8_REL_ERR = 0.05


class _MI300X:
    """The parts of vLLM's ``current_platform`` these files use, as on MI300X."""

    @staticmethod
    def fp8_dtype():
        return FP8

    @staticmethod
    def is_rocm():
        return True

    @staticmethod
    def get_device_capability():
        return (9, 4)  # gfx942

    @staticmethod
    def has_device_capability(capability):
        return capability <= 94


class DraftPath:
    """``chunked_prefill_paged_decode`` of one release, with its stand-ins."""

    def __init__(self, version: str, pkg: Path):
        self.version, self.pkg = version, pkg
        self.custom_calls: list[dict] = []
        self.decision = function_from_source(
            pkg / "platforms" / "rocm.py",
            "use_rocm_custom_paged_attention",
            {"torch": torch, "_ON_GFX9": True, "_ON_GFX1X": False, "on_cdna": lambda: True},
        )
        self.rocm = stub_module("vllm.platforms.rocm", use_rocm_custom_paged_attention=self.decision)
        ops = stub_module("vllm._custom_ops", paged_attention_rocm=self._custom_op)
        self.stubs = {
            **common_stubs(),
            "vllm._custom_ops": ops,
            "vllm.platforms": stub_module("vllm.platforms", current_platform=_MI300X()),
            "vllm.platforms.rocm": self.rocm,
        }
        self.stubs["vllm"].__dict__["_custom_ops"] = ops
        mods = load_vllm_files(
            pkg,
            self.stubs,
            [
                ("vllm.v1.attention.ops.prefix_prefill", PREFIX_PREFILL),
                ("vllm.v1.attention.ops.chunked_prefill_paged_decode", CHUNKED),
            ],
        )
        chunked = mods["vllm.v1.attention.ops.chunked_prefill_paged_decode"]
        self.fn = chunked.chunked_prefill_paged_decode

    def _custom_op(self, *args, **kwargs):
        # stands for the HIP kernel, which skips every request whose query length
        # is not 1 (all of a draft batch): it records the call and writes nothing
        self.custom_calls.append(kwargs)

    def __call__(self, batch: DraftBatch, causal: bool, production_dtype=torch.bfloat16):
        """Run the draft step as rocm_attn's forward does. The decode branch is
        chosen by vLLM's gfx9 decision for ``production_dtype`` (the model's query
        dtype; None: for the float32 tensors actually passed, i.e. the Triton
        decode kernel)."""
        decide = self.decision
        if production_dtype is not None:
            self.rocm.use_rocm_custom_paged_attention = lambda qtype, *a, **kw: decide(production_dtype, *a, **kw)
        out = torch.full_like(batch.q, float("nan"))
        try:
            with vllm_stubs_installed(self.stubs):
                self.fn(
                    query=batch.q,
                    key=batch.k,
                    value=batch.v,
                    output=out,
                    kv_cache_dtype=batch.kv_cache_dtype,
                    key_cache=batch.key_cache,
                    value_cache=batch.value_cache,
                    block_table=batch.table,
                    query_start_loc=batch.cu,
                    seq_lens=batch.seq_lens,
                    max_seq_len=int(batch.seq_lens.max()),
                    max_query_len=batch.qlen,
                    k_scale=batch.k_scale,
                    v_scale=batch.v_scale,
                    alibi_slopes=None,
                    sliding_window=NO_WINDOW[self.version],
                    sm_scale=D**-0.5,
                    output_scale=None,
                    sinks=None,
                    causal=causal,
                )
        finally:
            self.rocm.use_rocm_custom_paged_attention = decide
        return out


@pytest.fixture(scope="module", params=VERSIONS)
def draft_path(request, tmp_path_factory) -> DraftPath:
    """The release's draft path loaded from a copy patched as production images are
    (@triton.jit reads TRITON_INTERPRET when the files are executed)."""
    assert_interpreted()
    version = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        pkg = copy_vllm_package(version, tmp_path_factory.mktemp(f"vllm-{version}"))
        run = subprocess.run([sys.executable, str(PATCHER), "--vllm-root", str(pkg)], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        wheel = vllm_tree(version) / "vllm"
        for rel in DRAFT_PATH_FILES:  # what runs on MI300X is vLLM's own code
            assert (pkg / rel).read_bytes() == (wheel / rel).read_bytes(), (version, rel)
        yield DraftPath(version, pkg)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


class DraftBatch:
    """One DFlash draft step: per request a context already in the paged cache and
    a block of 1 + k query tokens whose K/V are passed densely (and written to the
    cache too, as do_kv_cache_update does before forward).

    Cache layout as ROCM_ATTN's split_kv_cache views it: key
    [blocks, kv_heads, head/x, block, x], value [blocks, kv_heads, head, block].
    Physical block 0 is never assigned (vLLM's null block); it, the free blocks and
    every slot past a request's length hold NaN, and the block table is wider than
    needed with padding entries pointing at block 0, as vLLM's is."""

    def __init__(self, k: int, cache: str, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.qlen, self.cache = 1 + k, cache
        n, qlen = len(CONTEXTS), 1 + k
        seq_lens = [c + qlen for c in CONTEXTS]
        pages = [-(-s // BLOCK) for s in seq_lens]
        num_blocks = 1 + sum(pages) + 3
        perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
        self.table = torch.zeros(n, max(pages) + 3, dtype=torch.int32)
        for i, p in enumerate(pages):
            self.table[i, :p] = torch.tensor([perm.pop() for _ in range(p)], dtype=torch.int32)

        def randn(*shape):
            return _bf16(torch.randn(*shape, generator=g))

        self.q = randn(n * qlen, HQ, D)
        self.k, self.v = randn(n * qlen, HKV, D), randn(n * qlen, HKV, D)
        ctx_k = [randn(c, HKV, D) for c in CONTEXTS]
        # values on another scale than keys, so that swapped scales would show
        ctx_v = [_bf16(3 * torch.randn(c, HKV, D, generator=g)) for c in CONTEXTS]
        self.ctx_k_exact, self.ctx_v_exact = ctx_k, ctx_v

        if cache == "fp8":
            self.kv_cache_dtype = "fp8"
            fmax = torch.finfo(FP8).max
            amax_k = max(t.abs().max() for t in ctx_k + [self.k])
            amax_v = max(t.abs().max() for t in ctx_v + [self.v])
            self.k_scale = torch.tensor([float(amax_k) / fmax], dtype=torch.float32)
            self.v_scale = torch.tensor([float(amax_v) / fmax], dtype=torch.float32)
        else:
            self.kv_cache_dtype = "auto"
            self.k_scale = torch.ones(1)
            self.v_scale = torch.ones(1)

        def stored(t, scale):  # what the cache holds (before the dtype cast)
            return t / scale if cache == "fp8" else t

        def represented(t, scale):  # what a cache entry stands for
            return (t / scale).to(FP8).to(torch.float32) * scale if cache == "fp8" else t

        self.ctx_k = [represented(t, self.k_scale) for t in ctx_k]
        self.ctx_v = [represented(t, self.v_scale) for t in ctx_v]

        x = X[cache]
        key_cache = torch.full((num_blocks, HKV, D // x, BLOCK, x), float("nan"))
        value_cache = torch.full((num_blocks, HKV, D, BLOCK), float("nan"))
        for i, c in enumerate(CONTEXTS):
            block_k = self.k[i * qlen : (i + 1) * qlen]
            block_v = self.v[i * qlen : (i + 1) * qlen]
            keys = torch.cat([stored(ctx_k[i], self.k_scale), stored(block_k, self.k_scale)])
            values = torch.cat([stored(ctx_v[i], self.v_scale), stored(block_v, self.v_scale)])
            for pos in range(c + qlen):
                b, off = int(self.table[i, pos // BLOCK]), pos % BLOCK
                key_cache[b, :, :, off, :] = keys[pos].view(HKV, D // x, x)
                value_cache[b, :, :, off] = values[pos]
        if cache == "fp8":
            key_cache, value_cache = key_cache.to(FP8), value_cache.to(FP8)
        self.key_cache, self.value_cache = key_cache, value_cache
        self.cu = torch.arange(n + 1, dtype=torch.int32) * qlen
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32)

    def reference(self, causal: bool, exact_context: bool = False) -> torch.Tensor:
        """Plain attention in float64: each request's block queries over its context
        (as the cache represents it, or the unquantised values) and its block."""
        out = []
        for i, c in enumerate(CONTEXTS):
            rows = slice(i * self.qlen, (i + 1) * self.qlen)
            ctx_k = (self.ctx_k_exact if exact_context else self.ctx_k)[i]
            ctx_v = (self.ctx_v_exact if exact_context else self.ctx_v)[i]
            k = torch.cat([ctx_k, self.k[rows]]).double().repeat_interleave(HQ // HKV, dim=1)
            v = torch.cat([ctx_v, self.v[rows]]).double().repeat_interleave(HQ // HKV, dim=1)
            s = torch.einsum("qhd,khd->hqk", self.q[rows].double(), k) * D**-0.5
            if causal:
                key_pos = torch.arange(c + self.qlen)
                query_pos = c + torch.arange(self.qlen)
                s = s.masked_fill(~(key_pos[None, :] <= query_pos[:, None])[None], float("-inf"))
            out.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), v))
        return torch.cat(out).float()

    def fp8_error(self, out: torch.Tensor, causal: bool) -> float:
        """Largest deviation of ``out`` from attention over the unquantised context,
        relative to the largest context value."""
        vmax = max(float(t.abs().max()) for t in self.ctx_v_exact)
        return float((out - self.reference(causal, exact_context=True)).abs().max()) / vmax


@pytest.fixture(scope="module")
def batches():
    return {(k, cache): DraftBatch(k, cache) for k in (2, 8) for cache in CACHES}


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("causal", [False, True], ids=["non-causal", "causal"])
@pytest.mark.parametrize("k", [2, 8])
def test_draft_step_matches_torch_reference(draft_path, batches, k, causal, cache):
    """The MI300X draft path (Triton context_attention_fwd; the ROCm custom decode
    op chosen for a bfloat16 query, which has nothing to do for this batch)."""
    batch = batches[(k, cache)]
    draft_path.custom_calls.clear()
    got = draft_path(batch, causal)
    # vLLM's gfx942 decision sent the decode branch to the ROCm custom op, once,
    # with the query boundaries it uses to skip multi-token requests
    assert len(draft_path.custom_calls) == 1
    assert torch.equal(draft_path.custom_calls[0]["query_start_loc"], batch.cu)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, batch.reference(causal), atol=2e-5, rtol=1e-4)
    if cache == "fp8":
        # against the unquantised context the error is FP8 rounding only, a few
        # percent of the values' range: the scales were applied (multiplied, each
        # to its own tensor; a swapped or divided scale is off by 3x or more)
        assert batch.fp8_error(got, causal) < FP8_REL_ERR


def test_triton_decode_fallback_leaves_draft_rows_alone(draft_path, batches):
    """Where the custom op is not chosen (here: the float32 query itself), the
    Triton decode kernel runs over the same batch and must skip every request."""
    batch = batches[(2, "bf16")]
    assert not draft_path.decision(batch.q.dtype, D, BLOCK, HQ // HKV, 64, 0, "auto")
    draft_path.custom_calls.clear()
    got = draft_path(batch, causal=False, production_dtype=None)
    assert draft_path.custom_calls == []
    torch.testing.assert_close(got, batch.reference(False), atol=2e-5, rtol=1e-4)


def test_references_tell_causal_from_non_causal(batches):
    """Guards the test itself: the two masks give different answers on every batch,
    far beyond the tolerance, and FP8 rounding is visible but small."""
    for (k, cache), batch in batches.items():
        diff = (batch.reference(True) - batch.reference(False)).abs().max()
        assert diff > 0.1, (k, cache, diff)
        if cache == "fp8":
            for causal in (False, True):
                err = batch.fp8_error(batch.reference(causal), causal)
                assert 1e-3 < err < FP8_REL_ERR, (k, causal, err)


@pytest.mark.parametrize("version", VERSIONS)
def test_gfx942_decode_branch_decision(version):
    """vLLM's own decision (gfx9) for the Kimi K2.6 draft's shapes: head 128, block
    16, GQA 8 (64 query / 8 KV heads), bfloat16 query, auto or FP8 cache -> the ROCm
    custom op; a float32 query -> the Triton decode kernel."""
    decide = function_from_source(
        vllm_tree(version) / "vllm" / "platforms" / "rocm.py",
        "use_rocm_custom_paged_attention",
        {"torch": torch, "_ON_GFX9": True, "_ON_GFX1X": False, "on_cdna": lambda: True},
    )
    for cache in ("auto", "fp8"):
        for gqa in (1, 8):
            assert decide(torch.bfloat16, 128, 16, gqa, 4096, 0, cache)
        assert not decide(torch.float32, 128, 16, 8, 4096, 0, cache)


def _call_keywords(tree: ast.AST, callee: str) -> list[dict[str, str]]:
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == callee
    ]
    return [{kw.arg: ast.unparse(kw.value) for kw in c.keywords} for c in calls]


@pytest.mark.parametrize("version", VERSIONS)
def test_causal_flag_reaches_the_kernel(version):
    """Source wiring of the path the test above runs: ROCM_ATTN declares non-causal
    support and hands ``attn_metadata.causal`` (built from the common metadata) to
    chunked_prefill_paged_decode, which passes it to context_attention_fwd, which
    launches _fwd_kernel with CAUSAL=causal."""
    pkg = vllm_tree(version) / "vllm"
    backend = ast.parse((pkg / BACKEND).read_text())
    chunked = ast.parse((pkg / CHUNKED).read_text())
    prefill = ast.parse((pkg / PREFIX_PREFILL).read_text())
    forward = next(n for n in ast.walk(backend) if isinstance(n, ast.FunctionDef) and n.name == "forward")
    to_chunked = _call_keywords(forward, "chunked_prefill_paged_decode")
    assert [kw["causal"] for kw in to_chunked] == ["attn_metadata.causal"]
    metadata = _call_keywords(backend, "RocmAttentionMetadata")
    assert [kw.get("causal") for kw in metadata] == ["common_attn_metadata.causal"]
    supports = next(n for n in ast.walk(backend) if isinstance(n, ast.FunctionDef) and n.name == "supports_non_causal")
    assert ast.unparse(supports.body[-1]) == "return True"
    assert [kw["causal"] for kw in _call_keywords(chunked, "context_attention_fwd")] == ["causal"]
    launches = [
        n
        for n in ast.walk(prefill)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript) and ast.unparse(n.func.value) == "_fwd_kernel"
    ]
    assert [{kw.arg: ast.unparse(kw.value) for kw in c.keywords}.get("CAUSAL") for c in launches] == ["causal"]
