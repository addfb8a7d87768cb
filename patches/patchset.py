# The declarative patch set applied by patch_dflash_rocm.py (data only: the engine
# reads PATCHES with ast.literal_eval and never executes this file).
#
# Each patch: id, group, what (one line), why (one line), upstream (how to tell vLLM
# already has the capability: every {file, contains} must hold; None = not upstream
# in any release we read), adds (new files installed next to the edits, source is
# relative to this file), variants (per version range: the target file and its
# edits). versions are half-open ranges [min, max) of release numbers. Each edit
# replaces an anchor that must occur exactly once; every replacement carries the
# bare marker "kimidflash:<id>" in a comment, which the engine stamps as
# "kimidflash:<id>@<hash of the variant's edits>" so an applied patch is recognised
# exactly and can be reverted (docs/patches.md, Markers).
# Paths are relative to the vllm package directory. Anchors were read from the
# PyPI wheels 0.20.2, 0.21.0 and 0.33.0 (tests/test_patcher_wheels.py checks them).

PATCHES = [
    {
        "id": "P1",
        "group": "1 AITER FA non-causal",
        "what": "AITER FA extend paths pass attn_metadata.causal instead of causal=True",
        "why": "extend_forward and the sliding-window extend hard-code causal=True, so a "
               "non-causal DFlash draft batch that lands there is silently causal",
        "upstream": None,
        "variants": [
            {
                "versions": [["0.20.0", "0.22.0"], ["0.33.0", "0.34.0"]],
                "file": "v1/attention/backends/rocm_aiter_fa.py",
                "edits": [
                    {
                        "anchor": "            causal=True,\n"
                                  "            window_size=self.sliding_window,\n"
                                  "            alibi_slopes=self.alibi_slopes,\n"
                                  "            return_lse=False,\n",
                        "replace": "            causal=attn_metadata.causal,  # kimidflash:P1\n"
                                   "            window_size=self.sliding_window,\n"
                                   "            alibi_slopes=self.alibi_slopes,\n"
                                   "            return_lse=False,\n",
                    },
                    {
                        "anchor": "            causal=True,\n"
                                  "            window_size=self.sliding_window,\n"
                                  "            alibi_slopes=self.alibi_slopes,\n"
                                  "            return_lse=True,\n",
                        "replace": "            causal=attn_metadata.causal,  # kimidflash:P1\n"
                                   "            window_size=self.sliding_window,\n"
                                   "            alibi_slopes=self.alibi_slopes,\n"
                                   "            return_lse=True,\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P2",
        "group": "1 AITER FA non-causal",
        "what": "non-causal multi-token decode refuses unequal query lengths with a clear error",
        "why": "the branch reshapes queries to (requests, max_query_len), valid only when "
               "every request has the same query length",
        "upstream": None,
        "variants": [
            {
                "versions": [["0.20.0", "0.22.0"]],
                "file": "v1/attention/backends/rocm_aiter_fa.py",
                "edits": [
                    {
                        "anchor": "                    if not attn_metadata.causal:\n"
                                  "                        from aiter.ops.triton.attention.mha_v3 import (\n",
                        "replace": "                    if not attn_metadata.causal:\n"
                                   "                        # kimidflash:P2 the reshape below needs equal query lengths\n"
                                   "                        if num_decode_tokens != num_decodes * decode_max_query_len:\n"
                                   "                            raise ValueError(\n"
                                   "                                \"non-causal multi-token decode needs equal query\"\n"
                                   "                                \" lengths per request (kimidflash P2)\"\n"
                                   "                            )\n"
                                   "                        from aiter.ops.triton.attention.mha_v3 import (\n",
                    },
                ],
            },
            {
                "versions": [["0.33.0", "0.34.0"]],
                "file": "v1/attention/backends/rocm_aiter_fa.py",
                "edits": [
                    {
                        "anchor": "                if not attn_metadata.causal:\n"
                                  "                    from aiter.ops.triton.attention.mha_v3 import (\n",
                        "replace": "                if not attn_metadata.causal:\n"
                                   "                    # kimidflash:P2 the reshape below needs equal query lengths\n"
                                   "                    if num_decode_tokens != num_decodes * decode_max_query_len:\n"
                                   "                        raise ValueError(\n"
                                   "                            \"non-causal multi-token decode needs equal query\"\n"
                                   "                            \" lengths per request (kimidflash P2)\"\n"
                                   "                        )\n"
                                   "                    from aiter.ops.triton.attention.mha_v3 import (\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P3",
        "group": "2 TRITON_MLA target",
        "what": "non-causal attention is requested for non-MLA (draft) layers only",
        "why": "0.20.x sets use_non_causal engine-wide for dflash, so the MLA target finds no "
               "MLA backend that supports it",
        "upstream": [{"file": "config/attention.py", "contains": "use_non_causal: bool"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.21.0"]],
                "file": "v1/attention/selector.py",
                "edits": [
                    {
                        "anchor": "    use_non_causal = (\n"
                                  "        speculative_config is not None and speculative_config.method == \"dflash\"\n"
                                  "    )\n",
                        "replace": "    use_non_causal = (\n"
                                   "        speculative_config is not None and speculative_config.method == \"dflash\"\n"
                                   "    )\n"
                                   "    # kimidflash:P3 only the DFlash draft is non-causal; the MLA target is not\n"
                                   "    use_non_causal = use_non_causal and not use_mla\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P4",
        "group": "2 TRITON_MLA target",
        "what": "with DFlash, ROCm offers TRITON_MLA first for MLA layers",
        "why": "0.20.x ROCm tries AITER MLA first; the recipe runs the MLA target on "
               "TRITON_MLA (kernel block 16, the block size it shares with the draft)",
        "upstream": [{"file": "config/attention.py", "contains": "use_non_causal: bool"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.21.0"]],
                "file": "platforms/rocm.py",
                "edits": [
                    {
                        "anchor": "    if use_mla:\n"
                                  "        if rocm_aiter_ops.is_mla_enabled():\n",
                        "replace": "    if use_mla:\n"
                                   "        # kimidflash:P4 DFlash: the MLA target runs on TRITON_MLA\n"
                                   "        from vllm.config import get_current_vllm_config_or_none\n"
                                   "\n"
                                   "        _cfg = get_current_vllm_config_or_none()\n"
                                   "        _spec = _cfg.speculative_config if _cfg is not None else None\n"
                                   "        if _spec is not None and _spec.method == \"dflash\":\n"
                                   "            return [AttentionBackendEnum.TRITON_MLA]\n"
                                   "        if rocm_aiter_ops.is_mla_enabled():\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P5",
        "group": "2 TRITON_MLA target",
        "what": "the draft model never inherits an MLA attention backend (PR 39930 backport)",
        "why": "an --attention-backend TRITON_MLA chosen for the target would otherwise be "
               "forced onto the draft's standard-attention layers",
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
                                   "        if _backend is not None and _backend.name.endswith(\"MLA\"):\n"
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
        "id": "P6",
        "group": "3 IS_CAUSAL in Triton unified attention",
        "what": "IS_CAUSAL constexpr in the kernel helpers: key mask and tile-loop bound",
        "why": "the helpers always build a causal mask and stop the tile loop at the "
               "query position",
        "upstream": [{"file": "v1/attention/ops/triton_unified_attention.py",
                      "contains": "USE_CAUSAL: tl.constexpr"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.21.0"]],
                "file": "v1/attention/ops/triton_attention_helpers.py",
                "edits": [
                    {
                        "anchor": "    CHUNK_SIZE: tl.constexpr = -1,\n"
                                  "):\n"
                                  "    \"\"\"Compute the tile-loop bounds",
                        "replace": "    CHUNK_SIZE: tl.constexpr = -1,\n"
                                   "    IS_CAUSAL: tl.constexpr = True,  # kimidflash:P6\n"
                                   "):\n"
                                   "    \"\"\"Compute the tile-loop bounds",
                    },
                    {
                        "anchor": "        max_seq_prefix_len = tl.minimum(max_seq_prefix_len, seq_len)\n",
                        "replace": "        max_seq_prefix_len = tl.minimum(max_seq_prefix_len, seq_len)\n"
                                   "    if not IS_CAUSAL:  # kimidflash:P6 every key of the sequence\n"
                                   "        max_seq_prefix_len = seq_len\n",
                    },
                    {
                        "anchor": "    CHUNK_SIZE: tl.constexpr = -1,\n"
                                  "):\n"
                                  "    \"\"\"Build the KV mask for one tile.",
                        "replace": "    CHUNK_SIZE: tl.constexpr = -1,\n"
                                   "    IS_CAUSAL: tl.constexpr = True,  # kimidflash:P6\n"
                                   "    seq_len=0,\n"
                                   "):\n"
                                   "    \"\"\"Build the KV mask for one tile.",
                    },
                    {
                        "anchor": "    seq_mask = seq_offset[None, :] <= query_abs_pos\n",
                        "replace": "    seq_mask = seq_offset[None, :] <= query_abs_pos\n"
                                   "    if not IS_CAUSAL:  # kimidflash:P6 bidirectional: every key < seq_len\n"
                                   "        seq_mask = (seq_offset[None, :] < seq_len) & (query_abs_pos >= 0)\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P7",
        "group": "3 IS_CAUSAL in Triton unified attention",
        "what": "kernel_unified_attention takes IS_CAUSAL; unified_attention passes causal "
                "instead of asserting it",
        "why": "0.20.x asserts causal, so a non-causal DFlash draft cannot run on TRITON_ATTN",
        "upstream": [{"file": "v1/attention/ops/triton_unified_attention.py",
                      "contains": "USE_CAUSAL: tl.constexpr"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.21.0"]],
                "file": "v1/attention/ops/triton_unified_attention.py",
                "edits": [
                    {
                        "anchor": "    USE_MM_PREFIX: tl.constexpr,  # bool\n",
                        "replace": "    USE_MM_PREFIX: tl.constexpr,  # bool\n"
                                   "    IS_CAUSAL: tl.constexpr,  # bool, kimidflash:P7\n",
                    },
                    {
                        "anchor": "        CHUNK_LOOKBACK,\n"
                                  "        CHUNK_SIZE,\n"
                                  "    )\n",
                        "replace": "        CHUNK_LOOKBACK,\n"
                                   "        CHUNK_SIZE,\n"
                                   "        IS_CAUSAL,  # kimidflash:P7\n"
                                   "    )\n",
                    },
                    {
                        "anchor": "            CHUNK_LOOKBACK,\n"
                                  "            CHUNK_SIZE,\n"
                                  "        )\n",
                        "replace": "            CHUNK_LOOKBACK,\n"
                                   "            CHUNK_SIZE,\n"
                                   "            IS_CAUSAL,  # kimidflash:P7\n"
                                   "            seq_len,\n"
                                   "        )\n",
                    },
                    {
                        "anchor": "    assert causal, \"Only causal attention is supported\"\n",
                        "replace": "    # kimidflash:P7 causal=False runs through IS_CAUSAL\n"
                                   "    assert causal or window_size[0] < 0, (\n"
                                   "        \"non-causal attention with a sliding window is not supported\"\n"
                                   "    )\n",
                    },
                    {
                        "anchor": "        USE_MM_PREFIX=use_mm_prefix,\n",
                        "replace": "        USE_MM_PREFIX=use_mm_prefix,\n"
                                   "        IS_CAUSAL=bool(causal),  # kimidflash:P7\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P8",
        "group": "3 IS_CAUSAL in Triton unified attention",
        "what": "TRITON_ATTN carries causal in its metadata, passes it to the kernel and "
                "declares non-causal support",
        "why": "0.20.x TRITON_ATTN calls unified_attention with causal=True and is rejected "
               "for a non-causal draft",
        "upstream": [{"file": "v1/attention/ops/triton_unified_attention.py",
                      "contains": "USE_CAUSAL: tl.constexpr"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.21.0"]],
                "file": "v1/attention/backends/triton_attn.py",
                "edits": [
                    {
                        "anchor": "    mm_prefix_range_tensor: torch.Tensor | None = None\n",
                        "replace": "    mm_prefix_range_tensor: torch.Tensor | None = None\n"
                                   "    causal: bool = True  # kimidflash:P8\n",
                    },
                    {
                        "anchor": "            softmax_segm_expsum=self.softmax_segm_expsum,\n"
                                  "        )\n"
                                  "        return attn_metadata\n",
                        "replace": "            softmax_segm_expsum=self.softmax_segm_expsum,\n"
                                   "            causal=common_attn_metadata.causal,  # kimidflash:P8\n"
                                   "        )\n"
                                   "        return attn_metadata\n",
                    },
                    {
                        "anchor": "            causal=True,\n"
                                  "            alibi_slopes=self.alibi_slopes,\n",
                        "replace": "            causal=attn_metadata.causal,  # kimidflash:P8\n"
                                   "            alibi_slopes=self.alibi_slopes,\n",
                    },
                    {
                        "anchor": "\n\nclass TritonAttentionImpl(",
                        "replace": "\n"
                                   "    @classmethod\n"
                                   "    def supports_non_causal(cls) -> bool:  # kimidflash:P8\n"
                                   "        return True\n"
                                   "\n\nclass TritonAttentionImpl(",
                    },
                ],
            },
        ],
    },
    {
        "id": "P9",
        "group": "4 DFlash causal assertions",
        "what": "the DFlash draft check also accepts backends that declare non-causal "
                "support without a causal metadata field",
        "why": "0.20.x asserts metadata.causal is False for every draft layer, judging the "
               "metadata's shape rather than the backend's declared capability",
        "upstream": [{"file": "v1/spec_decode/dflash.py", "contains": "if not self.dflash_causal:"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.21.0"]],
                "file": "v1/spec_decode/dflash.py",
                "edits": [
                    {
                        "anchor": "        for layer_name, attn_metadata in per_layer.items():\n"
                                  "            assert getattr(attn_metadata, \"causal\", None) is False, (\n",
                        "replace": "        # kimidflash:P9 judge by the backend's declared support; causal=True\n"
                                   "        # metadata is still rejected\n"
                                   "        _declared = {\n"
                                   "            name\n"
                                   "            for group in self.draft_attn_groups\n"
                                   "            if group.backend.supports_non_causal()\n"
                                   "            for name in group.layer_names\n"
                                   "        }\n"
                                   "        for layer_name, attn_metadata in per_layer.items():\n"
                                   "            assert getattr(attn_metadata, \"causal\", None) is False or (\n"
                                   "                layer_name in _declared and not hasattr(attn_metadata, \"causal\")\n"
                                   "            ), (\n",
                    },
                ],
            },
        ],
    },
    {
        "id": "P10",
        "group": "5 FP8 KV running-max scale",
        "what": "MLA KV-cache writes update k/v scales with a running max when "
                "KIMIDFLASH_FP8_KV_SCALE=running-max",
        "why": "without checkpoint KV scales vLLM writes the FP8 MLA cache with scale 1.0, "
               "which loses small values and clips large ones",
        "upstream": None,
        "adds": [{"path": "_kimidflash_fp8_kv.py", "source": "kimidflash_fp8_kv.py"}],
        "variants": [
            {
                "versions": [["0.20.0", "0.22.0"]],
                "file": "model_executor/layers/attention/mla_attention.py",
                "edits": [
                    {
                        "anchor": "from vllm.logger import init_logger\n",
                        "replace": "from vllm._kimidflash_fp8_kv import observe as _kimidflash_observe  # kimidflash:P10\n"
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
                        "replace": "from vllm._kimidflash_fp8_kv import observe as _kimidflash_observe  # kimidflash:P10\n"
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
]
