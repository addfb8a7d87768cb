"""Record, per attention layer, the largest |value| of what vLLM's KV cache stores.

Measured in a Hugging Face transformers forward pass (the same code on CPU here and
on the MI300X host), by instrumenting the model rather than re-implementing it:

* MLA (DeepseekV3, Kimi K2.x): vLLM caches one entry per token, the compressed latent
  ``kv_c_normed`` (the output of ``kv_a_layernorm``) next to the rope key ``k_pe``
  AFTER rotary, both under one scale. The latent is taken with a forward hook on
  ``kv_a_layernorm``; ``k_pe`` is the key a rope function returns.
* MHA (Llama, Qwen3): the keys after rotary (after ``k_norm`` for Qwen3: it runs
  before rope) are the key a rope function returns; the values are ``v_proj``'s output.

Why wrap the rope functions: transformers applies rotary inside the attention
forward through module-level functions (``apply_rotary_pos_emb`` and, for DeepseekV3
with interleaved weights, ``apply_rotary_pos_emb_interleave``), looked up as globals
of the modeling module at call time. Wrapping every ``apply_rotary_pos_emb*`` of
that module catches the post-rope key whatever the version's attention code looks
like; a forward pre-hook on each attention module says which layer is running. All
of it is undone in ``__exit__`` (also on error), so the model is unchanged after.
The interleaved variant permutes the rope dims relative to vLLM's layout; a maximum
does not depend on the order.

A layer whose rope function never ran during a forward is an error, not a zero: it
means this transformers version applies rotary some other way.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import KvCaptureError


@dataclass
class LayerMax:
    """Largest |value| seen so far for one layer (0.0 until something is seen)."""

    latent: float = 0.0  # mla: kv_c_normed
    rope: float = 0.0  # mla: k_pe after rotary
    k: float = 0.0  # mha: keys after rotary
    v: float = 0.0  # mha: values
    rope_calls: int = 0


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a *ForCausalLM (``model.model.layers`` in every family used here)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise KvCaptureError(f"{type(model).__name__}: no .model.layers; not a decoder-only causal LM")
    return list(layers)


def _amax(t: Any, what: str, layer: int) -> float:
    v = float(t.detach().abs().amax().float().item())
    if not math.isfinite(v):
        raise KvCaptureError(f"layer {layer}: {what} holds a non-finite value ({v}); the model or dtype overflows")
    return v


class KvCapture:
    """``with KvCapture(model, mla) as cap: model(ids)`` then ``cap.layers[i]``."""

    def __init__(self, model: Any, mla: bool):
        self.model = model
        self.mla = mla
        self.attn = [layer.self_attn for layer in decoder_layers(model)]
        self.layers = [LayerMax() for _ in self.attn]
        self._current: int | None = None
        self._handles: list[Any] = []
        self._patched: list[tuple[Any, str, Callable]] = []

    # ------------------------------------------------------------- recording
    def _record_rope(self, out: Any) -> None:
        i = self._current
        if i is None:
            return  # rope outside an attention layer (none in these models); nothing the cache stores
        key = out[1]
        m = self.layers[i]
        m.rope_calls += 1
        if self.mla:
            m.rope = max(m.rope, _amax(key, "k_pe after rotary", i))
        else:
            m.k = max(m.k, _amax(key, "key after rotary", i))

    def _wrap(self, fn: Callable) -> Callable:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            self._record_rope(out)
            return out

        wrapped.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapped

    # --------------------------------------------------------- instrumenting
    def __enter__(self) -> KvCapture:
        try:
            modules = {sys.modules[type(a).__module__] for a in self.attn}
            for mod in modules:
                names = [n for n in vars(mod) if n.startswith("apply_rotary_pos_emb") and callable(getattr(mod, n))]
                if not names:
                    raise KvCaptureError(
                        f"{mod.__name__}: no apply_rotary_pos_emb* function to wrap; this "
                        "transformers version applies rotary differently"
                    )
                for n in names:
                    orig = getattr(mod, n)
                    setattr(mod, n, self._wrap(orig))
                    self._patched.append((mod, n, orig))
            for i, a in enumerate(self.attn):
                self._handles.append(a.register_forward_pre_hook(self._enter_layer(i)))
                self._handles.append(a.register_forward_hook(self._leave_layer))
                if self.mla:
                    norm = getattr(a, "kv_a_layernorm", None)
                    if norm is None:
                        raise KvCaptureError(f"layer {i}: {type(a).__name__} has no kv_a_layernorm; not MLA attention")
                    self._handles.append(norm.register_forward_hook(self._latent_hook(i)))
                else:
                    v = getattr(a, "v_proj", None)
                    if v is None:
                        raise KvCaptureError(f"layer {i}: {type(a).__name__} has no v_proj")
                    self._handles.append(v.register_forward_hook(self._value_hook(i)))
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._restore()

    def _restore(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, n, orig in reversed(self._patched):
            setattr(mod, n, orig)
        self._patched.clear()
        self._current = None

    def _enter_layer(self, i: int) -> Callable:
        def hook(module: Any, args: Any) -> None:
            self._current = i

        return hook

    def _leave_layer(self, module: Any, args: Any, out: Any) -> None:
        self._current = None

    def _latent_hook(self, i: int) -> Callable:
        def hook(module: Any, args: Any, out: Any) -> None:
            self.layers[i].latent = max(self.layers[i].latent, _amax(out, "kv_c_normed (latent)", i))

        return hook

    def _value_hook(self, i: int) -> Callable:
        def hook(module: Any, args: Any, out: Any) -> None:
            self.layers[i].v = max(self.layers[i].v, _amax(out, "value", i))

        return hook

    # ---------------------------------------------------------------- checks
    def check_complete(self) -> None:
        """Every layer saw its rope key (and latent or value): else the capture missed it."""
        for i, m in enumerate(self.layers):
            if m.rope_calls == 0:
                raise KvCaptureError(
                    f"layer {i}: no rope call was seen inside its attention; this transformers "
                    "version applies rotary outside apply_rotary_pos_emb*"
                )
            if (self.mla and m.latent <= 0) or (not self.mla and m.v <= 0):
                raise KvCaptureError(f"layer {i}: no {'latent' if self.mla else 'value'} was recorded (all zero?)")
