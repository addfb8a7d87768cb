"""FP8 KV cache: scale formats, calibration, checkpoint scale shards, validation.

Split by concern: ``formats`` (FP8 facts), ``scales`` (the calibration result, one
typed shape used everywhere), ``calibrate`` (measures it), ``checkpoint`` (writes and
verifies scale tensors a stock vLLM loads), ``validate`` / ``degenerate`` (does FP8
output still agree with BF16). docs/fp8-kv.md is the user's guide.
"""
