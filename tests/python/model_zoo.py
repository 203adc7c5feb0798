"""Small configurations of Hugging Face ``transformers`` models of a dozen families, with
random weights (nothing is downloaded), and inputs for them: the models
tests/python/test_torch_models.py checks on the CPU and tests/gpu/models_gpu.py on a GPU."""

from __future__ import annotations

from typing import Any, Optional

import torch
import transformers

VOCAB = 320


def _text(h: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128) -> dict[str, Any]:
    return dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
                vocab_size=VOCAB)


# name -> (model class name, config class name, config arguments, input kind)
MODELS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "bert": ("BertModel", "BertConfig", _text(), "ids"),
    "gpt2": ("GPT2Model", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB), "ids"),
    "llama": ("LlamaModel", "LlamaConfig", dict(_text(), num_key_value_heads=2), "ids"),
    # Rotary embeddings whose key gradient keeps a head-transposed layout the backward views.
    "mistral": ("MistralModel", "MistralConfig", dict(_text(), num_key_value_heads=2), "ids"),
    "t5": ("T5Model", "T5Config", dict(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                                       vocab_size=VOCAB), "seq2seq"),
    "bart": ("BartModel", "BartConfig", dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                             decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                             vocab_size=VOCAB), "ids"),
    "deberta_v2": ("DebertaV2Model", "DebertaV2Config", _text(), "ids"),
    "falcon": ("FalconModel", "FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                   vocab_size=VOCAB), "ids"),
    "bloom": ("BloomModel", "BloomConfig", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB), "ids"),
    "vit": ("ViTModel", "ViTConfig", dict(_text(), image_size=32, patch_size=8), "image32"),
    "swin": ("SwinModel", "SwinConfig", dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                             window_size=4), "image32"),
    "convnext": ("ConvNextModel", "ConvNextConfig", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                         image_size=64), "image64"),
}


def build(name: str, device: str = "cpu", dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    model_cls, config_cls, kwargs, _ = MODELS[name]
    config = getattr(transformers, config_cls)(**kwargs)
    for key, value in list(vars(config).items()):  # dropout off: eager and kiln see one network
        if isinstance(value, float) and ("dropout" in key or key.endswith("_pdrop")):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval().to(device)
    return model if dtype is None else model.to(dtype)


def inputs(name: str, length: int = 24, batch: int = 2, seed: int = 1, device: str = "cpu",
           dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    kind = MODELS[name][3]
    if kind.startswith("image"):
        side = int(kind[len("image"):])
        return {"pixel_values": torch.randn(batch, 3, side, side, generator=gen).to(device, dtype)}
    out = {"input_ids": torch.randint(0, VOCAB, (batch, length), generator=gen)}
    if kind == "seq2seq":
        out["decoder_input_ids"] = torch.randint(0, VOCAB, (batch, length // 2), generator=gen)
    return {k: v.to(device) for k, v in out.items()}


def tensors(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a model output, in order."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, (tuple, list)):
        return [t for x in out for t in tensors(x)]
    return []
