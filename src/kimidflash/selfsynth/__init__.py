"""Conversations the target writes itself: user turns from its chat template's user prefix, answered
greedily (Magpie)."""
