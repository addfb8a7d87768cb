"""The HF capture source returns the residual stream after decoder layer L for layer id L (fast tier).

That is what vLLM hands a DFlash drafter for `target_layer_ids` (it adds 1 and
captures after that many layers); an off-by-one here silently ruins acceptance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ..support.helpers import random_llama

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return random_llama(
        tmp_path_factory.mktemp("llama"),
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
    )


def test_layer_id_is_the_output_of_that_decoder_layer(tiny_llama):
    from transformers import LlamaForCausalLM

    from kimidflash.train.capture import HFCapture

    src = HFCapture(tiny_llama, [0, 2], dtype=torch.float32)
    ids = [3, 9, 27, 5, 11, 2]
    feats = src.features(ids)
    assert feats.shape == (6, 64)
    m = LlamaForCausalLM.from_pretrained(tiny_llama).eval()
    captured = {}
    hooks = [
        m.model.layers[i].register_forward_hook(
            lambda mod, a, out, i=i: captured.__setitem__(i, (out[0] if isinstance(out, tuple) else out)[0])
        )
        for i in (0, 2)
    ]
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


def _served_states(tmp_path, answer):
    """A VLLMCapture whose server is a stub: each request's hidden states file is
    written the way ExampleHiddenStatesConnector writes it (file + .lock)."""
    import httpx
    from safetensors.torch import save_file

    from kimidflash.train.capture_vllm import VLLMCapture

    sent = []

    def handler(request):
        import json

        body = json.loads(request.content)
        sent.append(body)
        ids = body["prompt"]
        path = str(tmp_path / f"req-{'-'.join(map(str, ids))}.safetensors")  # requests arrive from several threads
        hs, tok = answer(ids)
        save_file({"hidden_states": hs, "token_ids": torch.tensor(tok)}, path)
        Path(path + ".lock").touch()
        return httpx.Response(
            200, json={"choices": [{"text": "x"}], "kv_transfer_params": {"hidden_states_path": path}}
        )

    src = VLLMCapture("http://stub/v1", "tgt", [1, 5], dtype=torch.float32, concurrency=2)
    src.client = httpx.Client(base_url="http://stub", transport=httpx.MockTransport(handler))
    return src, sent


def test_vllm_source_reads_each_requests_states_and_removes_the_files(tmp_path):
    def answer(ids):
        return torch.arange(len(ids) * 2 * 3, dtype=torch.float32).view(len(ids), 2, 3), ids

    src, sent = _served_states(tmp_path, answer)
    feats = [c.feats for c in src.capture_many([[7, 8, 9], [4, 5]])]
    assert [f.shape for f in feats] == [(3, 6), (2, 6)]
    assert torch.equal(feats[0][1], torch.arange(6, 12, dtype=torch.float32))  # [layer 1 | layer 5] of token 1
    assert sorted(b["prompt"] for b in sent) == [[4, 5], [7, 8, 9]]
    assert all(b["max_tokens"] == 1 and b["model"] == "tgt" for b in sent)
    assert list(tmp_path.iterdir()) == []  # both the file and its lock are gone


def test_vllm_source_refuses_other_tokens_or_other_layers(tmp_path):
    from kimidflash.errors import CaptureError

    src, _ = _served_states(tmp_path, lambda ids: (torch.zeros(len(ids), 2, 3), ids[:-1] + [0]))
    with pytest.raises(CaptureError, match="differ from the 3 sent"):
        src.features([1, 2, 3])
    src, _ = _served_states(tmp_path, lambda ids: (torch.zeros(len(ids), 3, 3), ids))
    with pytest.raises(CaptureError, match=r"other layers than \[1, 5\]"):
        src.features([1, 2, 3])


def test_vllm_source_names_a_server_that_is_not_capturing():
    import httpx

    from kimidflash.errors import CaptureError
    from kimidflash.train.capture_vllm import VLLMCapture

    src = VLLMCapture("http://stub", "tgt", [1])
    src.client = httpx.Client(
        base_url="http://stub",
        transport=httpx.MockTransport(
            lambda r: httpx.Response(200, json={"choices": [{"text": "x"}], "kv_transfer_params": None})
        ),
    )
    with pytest.raises(CaptureError, match="SPECULATIVE_METHOD=extract_hidden_states"):
        src.features([1, 2])


def test_vllm_stream_mode_needs_a_served_target_and_the_kimi_config_names_one():
    from kimidflash.errors import TrainConfigError
    from kimidflash.train import config as train_config
    from kimidflash.train.capture import make_source

    from ..support.helpers import CONFIGS

    gate = train_config.load(CONFIGS / "train-overfit-gate.json", {"capture.mode": "stream"})
    with pytest.raises(TrainConfigError, match="capture.base_url"):
        make_source(gate, "/nonexistent", [1])
    kimi = train_config.load(CONFIGS / "train-kimi-k2.6.json")
    assert (kimi.capture.source, kimi.capture.mode) == ("vllm", "stream") and kimi.capture.base_url


def test_hf_source_stores_the_targets_top_k_for_distillation(tiny_llama):
    from transformers import LlamaForCausalLM

    from kimidflash.train.capture import HFCapture

    ids = [3, 9, 27, 5, 11, 2]
    plain = HFCapture(tiny_llama, [0, 2], dtype=torch.float32).capture(ids)
    cap = HFCapture(tiny_llama, [0, 2], dtype=torch.float32, topk=4).capture(ids)
    assert plain.topk is None and torch.equal(plain.feats, cap.feats)
    top_ids, top_lp = cap.topk
    with torch.no_grad():
        logits = LlamaForCausalLM.from_pretrained(tiny_llama).eval()(torch.tensor([ids])).logits[0]
    assert top_ids[1:, 0].tolist() == logits[:-1].argmax(-1).tolist()  # row t: the target's guess for token t
    assert top_ids.shape == top_lp.shape == (6, 4)
