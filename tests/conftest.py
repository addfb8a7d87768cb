"""Shared fixtures. Tiers: plain tests are the fast tier (seconds); tests marked
`slow` run real vLLM on CPU, real vLLM wheels or a real Docker engine."""
