"""The sweep's Hugging Face ``transformers`` families, each built from a small configuration (two
layers, hidden 64, vocabulary of zoo.VOCAB, short sequences or 64x64 images) with random weights
and dropout off; nothing is downloaded. Decoders run without a key/value cache; speech models
without SpecAugment's random time masks (``mask_time_prob=0``: like dropout, random in training).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from zoo import VOCAB, Spec


def _hf(model_cls: str, config_cls: str, kwargs: dict[str, Any], part: str = "") -> Callable[[], torch.nn.Module]:
    """Builds ``model_cls(config_cls(**kwargs))``; ``part``: an attribute path of the model to
    return instead (``encoder``)."""

    def make() -> torch.nn.Module:
        import transformers

        config = getattr(transformers, config_cls)(**kwargs)
        for key, value in list(vars(config).items()):
            if isinstance(value, float) and ("drop" in key or key.endswith("_pdrop")):
                setattr(config, key, 0.0)
        if hasattr(config, "use_cache"):
            config.use_cache = False
        model = getattr(transformers, model_cls)(config)
        for attr in filter(None, part.split(".")):
            model = getattr(model, attr)
        return model

    return make


def text(h: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128, **kw: Any) -> dict[str, Any]:
    return dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
                vocab_size=VOCAB, **kw)


def hf(name: str, model_cls: str, config_cls: str, kwargs: dict[str, Any], kind: str, covers: str,
       part: str = "", **spec: Any) -> Spec:
    if kind == "image":
        spec.setdefault("input_key", "pixel_values")
    return Spec(f"hf/{name}", "transformers", _hf(model_cls, config_cls, kwargs, part), kind=kind, covers=covers,
                **spec)


IMG = dict(image_size=64)

HF = [
    # Encoders.
    hf("bert", "BertModel", "BertConfig", text(), "text", "encoder, padded attention mask, GELU, pooler tanh"),
    hf("roberta", "RobertaModel", "RobertaConfig", text(pad_token_id=1), "text", "position ids from the mask (cumsum)"),
    hf("distilbert", "DistilBertModel", "DistilBertConfig",
       dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=VOCAB), "text", "DistilBERT attention"),
    hf("albert", "AlbertModel", "AlbertConfig", text(embedding_size=32), "text",
       "factorised embedding, one layer shared by all"),
    hf("electra", "ElectraModel", "ElectraConfig", text(embedding_size=32), "text", "embedding projection"),
    hf("deberta", "DebertaModel", "DebertaConfig", text(), "text", "disentangled attention (relative positions)"),
    hf("deberta_v2", "DebertaV2Model", "DebertaV2Config", text(), "text", "log-bucketed relative positions"),
    hf("mpnet", "MPNetModel", "MPNetConfig", text(), "text", "relative attention bias buckets"),
    hf("funnel", "FunnelBaseModel", "FunnelConfig",
       dict(block_sizes=[1, 1], d_model=64, n_head=4, d_head=16, d_inner=128, vocab_size=VOCAB), "text",
       "pooling of the sequence between blocks, relative attention", lengths=(24, 16)),
    hf("mobilebert", "MobileBertModel", "MobileBertConfig",
       dict(hidden_size=64, embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64, num_feedforward_networks=2, vocab_size=VOCAB), "text",
       "bottlenecks, NoNorm (elementwise affine), trigram embedding"),
    hf("convbert", "ConvBertModel", "ConvBertConfig", text(embedding_size=64), "text",
       "span-based dynamic convolution: unfold"),
    hf("squeezebert", "SqueezeBertModel", "SqueezeBertConfig", text(embedding_size=64), "text",
       "grouped conv1d in place of linear layers"),
    hf("fnet", "FNetModel", "FNetConfig", dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                               vocab_size=VOCAB), "text", "FFT token mixing (complex)", mask=False),
    hf("xlnet", "XLNetModel", "XLNetConfig", dict(d_model=64, n_layer=2, n_head=4, d_inner=128, vocab_size=VOCAB),
       "text", "two-stream relative attention, einsum"),
    hf("longformer", "LongformerModel", "LongformerConfig", text(attention_window=[8, 8], pad_token_id=1), "text",
       "sliding-window attention: chunked as_strided views, padding to the window", lengths=(32, 20)),
    # Decoders.
    hf("gpt2", "GPT2Model", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB), "text",
       "causal decoder, Conv1D layers, GELU tanh"),
    hf("gpt_neo", "GPTNeoModel", "GPTNeoConfig",
       dict(hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=8,
            vocab_size=VOCAB), "text", "local (windowed) and global attention"),
    hf("gptj", "GPTJModel", "GPTJConfig", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=VOCAB),
       "text", "partial rotary embeddings (interleaved), parallel attention and MLP"),
    hf("gpt_neox", "GPTNeoXModel", "GPTNeoXConfig", text(), "text", "rotary on a fraction of each head"),
    hf("gpt_bigcode", "GPTBigCodeModel", "GPTBigCodeConfig", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB),
       "text", "multi-query attention"),
    hf("opt", "OPTModel", "OPTConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                                            word_embed_proj_dim=64, vocab_size=VOCAB), "text",
       "learned positions offset by the mask"),
    hf("llama", "LlamaModel", "LlamaConfig", text(num_key_value_heads=2), "text",
       "rotary embeddings, grouped-query attention, RMSNorm, SiLU gate"),
    hf("mistral", "MistralModel", "MistralConfig", text(num_key_value_heads=2, sliding_window=16), "text",
       "sliding-window causal mask"),
    hf("mixtral", "MixtralModel", "MixtralConfig", text(num_key_value_heads=2, num_local_experts=4,
                                                        num_experts_per_tok=2), "text",
       "mixture of experts: top-k routing, index_add over experts"),
    hf("qwen2", "Qwen2Model", "Qwen2Config", text(num_key_value_heads=2), "text", "biased q/k/v projections"),
    hf("qwen3", "Qwen3Model", "Qwen3Config", text(num_key_value_heads=2, head_dim=16), "text",
       "RMSNorm on queries and keys"),
    hf("phi", "PhiModel", "PhiConfig", text(), "text", "partial rotary, parallel blocks, GELU tanh"),
    hf("phi3", "Phi3Model", "Phi3Config", text(num_key_value_heads=2, pad_token_id=0), "text",
       "fused qkv and gate-up projections"),
    hf("gemma", "GemmaModel", "GemmaConfig", text(num_key_value_heads=1, head_dim=16), "text",
       "scaled embeddings, RMSNorm (1 + weight), GELU tanh gate"),
    hf("gemma2", "Gemma2Model", "Gemma2Config", text(num_key_value_heads=1, head_dim=16, sliding_window=16), "text",
       "logit soft-capping (tanh), sandwich norms, alternating sliding windows"),
    hf("falcon", "FalconModel", "FalconConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                     vocab_size=VOCAB), "text", "multi-query, parallel attention"),
    hf("bloom", "BloomModel", "BloomConfig", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB), "text",
       "ALiBi position bias, baddbmm"),
    # Encoder-decoders.
    hf("t5", "T5Model", "T5Config", dict(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                                         vocab_size=VOCAB), "seq2seq", "relative position buckets, RMS layer norm"),
    hf("bart", "BartModel", "BartConfig",
       dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB), "seq2seq", "cross attention"),
    hf("marian", "MarianModel", "MarianConfig",
       dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0),
       "seq2seq", "sinusoidal positions, SiLU"),
    hf("pegasus", "PegasusModel", "PegasusConfig",
       dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB), "seq2seq", "pre-norm, sinusoidal positions"),
    # Speech.
    hf("wav2vec2", "Wav2Vec2Model", "Wav2Vec2Config",
       dict(text(), conv_dim=(32, 32, 32), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.0), "audio",
       "conv feature encoder, group norm, grouped positional conv with weight norm"),
    hf("hubert", "HubertModel", "HubertConfig",
       dict(text(), conv_dim=(32, 32, 32), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.0), "audio",
       "HuBERT encoder"),
    hf("whisper_encoder", "WhisperModel", "WhisperConfig",
       dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=16, vocab_size=VOCAB,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
       "features", "Whisper encoder: two conv1d, GELU, sinusoidal positions", part="encoder", channels=16, frames=32),
    # Vision.
    hf("vit", "ViTModel", "ViTConfig", text(image_size=64, patch_size=16), "image", "HF ViT"),
    hf("deit", "DeiTModel", "DeiTConfig", text(image_size=64, patch_size=16), "image", "distillation token"),
    hf("beit", "BeitModel", "BeitConfig", text(image_size=64, patch_size=16, use_relative_position_bias=True),
       "image", "relative position bias, layer scale, mean pooling"),
    hf("dinov2", "Dinov2Model", "Dinov2Config", text(image_size=64, patch_size=16), "image",
       "interpolated position embedding, layer scale"),
    hf("data2vec_vision", "Data2VecVisionModel", "Data2VecVisionConfig",
       text(image_size=64, patch_size=16, use_relative_position_bias=True), "image", "Data2Vec vision (BEiT-like)"),
    hf("clip_vision", "CLIPVisionModel", "CLIPVisionConfig", text(image_size=64, patch_size=16), "image",
       "quick GELU, pre-layernorm"),
    hf("convnext", "ConvNextModel", "ConvNextConfig", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                           image_size=64), "image", "HF ConvNeXt"),
    hf("convnextv2", "ConvNextV2Model", "ConvNextV2Config", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                                 image_size=64), "image", "global response norm"),
    hf("swin", "SwinModel", "SwinConfig", dict(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1],
                                               num_heads=[2, 2], window_size=4), "image", "HF Swin"),
    hf("swinv2", "Swinv2Model", "Swinv2Config", dict(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1],
                                                     num_heads=[2, 2], window_size=4), "image",
       "HF Swin V2: cosine attention, log-spaced position MLP"),
    hf("segformer", "SegformerModel", "SegformerConfig",
       dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
            patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]), "image",
       "efficient self-attention (reduced keys), mix-FFN with depthwise conv"),
    hf("mobilevit", "MobileViTModel", "MobileViTConfig",
       dict(image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 24, 32, 40, 96]), "image",
       "unfold and fold around transformers"),
    hf("resnet", "ResNetModel", "ResNetConfig", dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                                     depths=[1, 1, 1, 1]), "image", "HF ResNet"),
    hf("regnet", "RegNetModel", "RegNetConfig", dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                                     depths=[1, 1, 1, 1], groups_width=8), "image", "HF RegNet"),
    hf("poolformer", "PoolFormerModel", "PoolFormerConfig", dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
       "image", "HF PoolFormer: GroupNorm(1), pool minus input"),
    hf("levit", "LevitModel", "LevitConfig", dict(image_size=64, hidden_sizes=[32, 48, 64], depths=[1, 1, 1],
                                                  num_attention_heads=[2, 3, 4], key_dim=[8, 8, 8]), "image",
       "attention bias indexed by offsets, hardswish"),
    hf("efficientnet", "EfficientNetModel", "EfficientNetConfig", dict(image_size=64, depth_coefficient=0.5), "image",
       "HF EfficientNet"),
    hf("mobilenet_v2", "MobileNetV2Model", "MobileNetV2Config", dict(image_size=64, depth_multiplier=0.35),
       "image", "HF MobileNetV2 (TF padding)"),
    hf("bit", "BitModel", "BitConfig", dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                            num_groups=4), "image", "BiT: weight-standardised convs, group norm"),
]
