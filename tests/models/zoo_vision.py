"""The sweep's image classifiers: one small member of every torchvision classification family,
and timm families chosen for the ops they use (tests/models/zoo.py says how each is made
comparable). Random weights, 10 classes, 64x64 images unless a family needs more; a family
whose smallest member is large is built smaller through its constructor's own arguments
(depth, width), its code unchanged.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from zoo import Spec


def _tv(name: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=10, **kw)

    return make


def _tv_class(name: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(num_classes=10, **kw)

    return make


def tv(name: str, covers: str, side: int = 64, make: Any = None, **kw: Any) -> Spec:
    return Spec(f"tv/{name}", "torchvision", make or _tv(name, **kw), side=side, covers=covers)


TORCHVISION = [
    tv("alexnet", "large-kernel convolutions, max pool, dropout classifier"),
    tv("resnet18", "batch norm, ReLU, max pool, residual adds, adaptive average pool"),
    tv("resnext50_32x4d", "grouped convolutions in bottlenecks"),
    tv("wide_resnet50_2", "wide bottlenecks"),
    tv("vgg11_bn", "plain conv stack with batch norm, 7x7 adaptive pool over a 1x1 map", side=32),
    tv("densenet121", "dense concatenations, average-pool transitions"),
    tv("mobilenet_v2", "inverted residuals, ReLU6, depthwise convolutions"),
    tv("mobilenet_v3_small", "hardswish, hardsigmoid, squeeze-excitation"),
    tv("mnasnet0_5", "MnasNet blocks"),
    tv("shufflenet_v2_x0_5", "channel shuffle (view, transpose, view), chunk, cat"),
    tv("squeezenet1_1", "ceil-mode max pool, fire-module concatenations"),
    tv("efficientnet_b0", "SiLU, squeeze-excitation, stochastic depth"),
    tv("efficientnet_v2_s", "fused MBConv"),
    tv("regnet_x_400mf", "RegNet X: grouped bottlenecks"),
    tv("regnet_y_400mf", "RegNet Y: squeeze-excitation"),
    tv("convnext_tiny", "layer norm over permuted activations, layer scale, 7x7 depthwise"),
    tv("vit", "class token, MultiheadAttention (torchvision ViT, 2 layers, hidden 64)",
       make=_tv_class("VisionTransformer", image_size=64, patch_size=16, num_layers=2, num_heads=4,
                      hidden_dim=64, mlp_dim=128)),
    tv("swin_t", "shifted windows: roll, padding, relative position bias"),
    tv("swin_v2_t", "Swin V2: cosine attention, continuous position bias MLP"),
    tv("maxvit_t", "MBConv plus block and grid attention (MaxVit, 2 stages)",
       make=_tv_class("MaxVit", input_size=(64, 64), stem_channels=16, partition_size=4, block_channels=[32, 64],
                      block_layers=[1, 1], head_dim=16, stochastic_depth_prob=0.0)),
    tv("googlenet", "inception branches, ceil-mode pooling",
       make=_tv("googlenet", aux_logits=False, init_weights=True)),
    tv("inception_v3", "factorised convolutions, asymmetric kernels", side=96,
       make=_tv("inception_v3", aux_logits=False, init_weights=True)),
]


def _timm(name: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kw)

    return make


def tm(name: str, covers: str, side: int = 64, drop: bool = False, **kw: Any) -> Spec:
    """A timm model; ``kw`` goes to ``timm.create_model``. ``drop``: the family also runs the
    ``train-drop`` mode (drop-path 0.1, dropout 0.1)."""
    dropped = _timm(name, drop_path_rate=0.1, drop_rate=0.1, **kw) if drop else None
    return Spec(f"timm/{name}", "timm", _timm(name, **kw), side=side, covers=covers, drop=dropped)


SMALL_VIT: dict[str, Any] = dict(img_size=64, depth=2)  # a ViT-like family's code at two blocks

TIMM = [
    # Convolutional networks.
    tm("resnet10t", "deep tiered stem, average-pool downsample"),
    tm("seresnet18", "squeeze-excitation"),
    tm("ecaresnet26t", "ECA: conv1d over pooled channels"),
    tm("skresnet18", "selective kernel: softmax over branches"),
    tm("resnest14d", "split attention (radix softmax)"),
    tm("res2net50_14w_8s", "hierarchical split and add inside a block"),
    tm("regnetx_002", "timm RegNet"),
    tm("regnetz_b16", "RegNet Z: SE, SiLU, inverted bottleneck"),
    tm("resnetv2_18", "pre-activation residual blocks"),
    tm("dla46_c", "deep layer aggregation tree"),
    tm("dpn48b", "dual path: residual and dense paths, slicing"),
    tm("densenet121", "timm DenseNet: memory-efficient concatenations"),
    tm("tf_efficientnet_b0", "'same' padding: a pad before each convolution", drop=True),
    tm("mobilenetv3_small_050", "hard activations, SE with hardsigmoid"),
    tm("mobilenetv4_conv_small", "universal inverted bottlenecks"),
    tm("hardcorenas_a", "hard activations, NAS blocks"),
    tm("mnasnet_small", "timm MnasNet"),
    tm("fbnetc_100", "FBNet blocks"),
    tm("ghostnet_050", "ghost modules: cheap operations, concatenation and slicing"),
    tm("ghostnetv2_100", "DFC attention: average pool, sigmoid gate, nearest upsampling"),
    tm("lcnet_050", "PP-LCNet: hardswish, SE, 5x5 depthwise"),
    tm("rexnet_100", "ReXNet: partial residual (channel-padded add)"),
    tm("tinynet_e", "TinyNet (EfficientNet scaling)"),
    tm("mixnet_s", "mixed depthwise kernels: split, per-chunk convolutions, cat"),
    tm("gernet_s", "GENet (byobnet)"),
    tm("repvgg_a0", "RepVGG: three branches summed"),
    tm("cs3darknet_s", "cross-stage partial blocks, SiLU"),
    tm("darknet17", "leaky ReLU"),
    tm("ese_vovnet19b_slim", "one-shot aggregation, effective SE with hardsigmoid"),
    tm("hrnet_w18_small", "multi-resolution branches fused by nearest upsampling"),
    tm("nf_regnet_b0", "normalizer-free: scaled weight standardization, skip gain"),
    tm("eca_nfnet_l0", "NFNet: weight standardization by batch_norm on weights, GELU gamma"),
    tm("tresnet_m", "space-to-depth stem, anti-aliased downsampling, in-place activations"),
    tm("selecsls42b", "SelecSLS concatenations"),
    tm("hgnetv2_b0", "HGNetV2: learnable affine blocks, light convolutions"),
    tm("inception_v3", "timm Inception V3", side=96),
    tm("xception41", "separable convolutions (aligned Xception)"),
    tm("starnet_s1", "star operation: elementwise product of two branches"),
    tm("mambaout_femto", "gated CNN blocks, channels-last layer norm"),
    tm("rdnet_tiny", "RDNet: dense blocks with layer norm"),
    # Attention in convolutional networks.
    tm("botnet26t_256", "bottleneck self-attention with relative position logits", img_size=64),
    tm("halonet26t", "halo attention: unfold into blocks with halos", side=256),
    tm("lambda_resnet26t", "lambda layer"),
    tm("sebotnet33ts_256", "SE plus bottleneck attention", img_size=64),
    tm("bat_resnext26ts", "bilinear attention transform", side=256),
    # Norms and token mixers of MetaFormers.
    tm("poolformer_s12", "GroupNorm(1), average-pool token mixer (pool minus input)"),
    tm("poolformerv2_s12", "StarReLU, scale layers"),
    tm("convformer_s18", "separable-conv token mixer"),
    tm("caformer_s18", "conv stages then attention stages"),
    tm("convnext_atto", "LayerNorm2d, layer scale", drop=True),
    tm("convnextv2_atto", "global response norm"),
    tm("inception_next_tiny", "inception depthwise token mixer: split into band kernels"),
    tm("edgenext_xx_small", "split depthwise transposed attention (cross-covariance)"),
    tm("fastvit_t8", "reparameterisable token mixer"),
    # MLP mixers.
    tm("mixer_s16_224", "MLP-mixer: token mixing over transposed patches", img_size=64),
    tm("resmlp_12_224", "affine layers instead of norms", img_size=64),
    tm("gmlp_ti16_224", "spatial gating unit", img_size=64),
    # Vision transformers.
    tm("vit_tiny_patch16_224", "plain ViT", **SMALL_VIT, drop=True),
    tm("deit_tiny_distilled_patch16_224", "distillation token: two heads averaged", **SMALL_VIT),
    tm("beit_base_patch16_224", "relative position bias table, layer scale", img_size=64, depth=2, embed_dim=64,
       num_heads=4, drop=True),
    tm("eva02_tiny_patch14_224", "rotary position embedding, SwiGLU", **SMALL_VIT),
    tm("vit_relpos_small_patch16_224", "relative position MLP", **SMALL_VIT),
    tm("vit_little_patch16_reg1_gap_256", "register tokens, global average pooling", **SMALL_VIT),
    tm("cait_xxs24_224", "class attention, talking heads, layer scale", img_size=64, depth=2),
    tm("convit_tiny", "gated positional self-attention", img_size=64, depth=2),
    tm("crossvit_tiny_240", "two branches joined by cross attention, interpolated patches"),
    tm("pit_ti_224", "pooling-based ViT: depthwise conv pooling of tokens", img_size=64),
    tm("tnt_s_patch16_224", "transformer in transformer: unfold into pixels", img_size=64, depth=2),
    tm("twins_pcpvt_small", "positional conv, spatial-reduction attention"),
    tm("twins_svt_small", "locally grouped and global sub-sampled attention"),
    tm("pvt_v2_b0", "spatial-reduction attention, depthwise conv in the MLP"),
    tm("xcit_nano_12_p16_224", "cross-covariance attention (L2-normalised), Fourier positions", depth=2),
    tm("visformer_tiny", "visformer: conv stages then attention", img_size=64),
    tm("nest_tiny", "nested hierarchy: block aggregation", img_size=64),
    tm("hiera_tiny_224", "Hiera: mask-unit attention, unrolled tokens", img_size=64),
    tm("mvitv2_tiny", "MViTv2: pooling attention, decomposed relative positions", img_size=64),
    tm("volo_d1_224", "outlook attention: unfold and fold", img_size=64),
    # Windowed and hybrid attention.
    tm("swin_tiny_patch4_window7_224", "shifted windows, relative position bias", img_size=64, window_size=4),
    tm("swinv2_cr_tiny_ns_224", "cosine attention, continuous position bias, no shift at small sizes",
       img_size=64, window_size=4),
    tm("maxvit_rmlp_nano_rw_256", "block and grid attention, relative position MLP", img_size=64),
    tm("coatnet_nano_rw_224", "CoAtNet: MBConv then relative attention", img_size=64),
    tm("coat_lite_tiny", "conv-attention: factorized attention, conv relative position", img_size=64),
    tm("levit_128s", "attention with a bias table, hardswish, BatchNorm1d", img_size=64),
    tm("mobilevit_xxs", "unfold into patches, transformer, fold back"),
    tm("mobilevitv2_050", "separable self-attention, GroupNorm(1)"),
    tm("efficientformer_l1", "pool mixer then a final attention stage (4D and 3D)", side=224),
    tm("efficientformerv2_s0", "attention with talking heads and a local conv", img_size=64),
    tm("davit_tiny", "dual attention: spatial windows and channel groups"),
    tm("focalnet_tiny_srf", "focal modulation: gated multi-level depthwise context"),
    tm("efficientvit_b0", "ReLU linear attention (MIT EfficientViT), multi-scale"),
    tm("efficientvit_m0", "cascaded group attention (MSRA EfficientViT)", img_size=64),
    tm("repvit_m1", "RepViT: reparameterised depthwise blocks"),
    tm("tiny_vit_5m_224", "TinyViT: windowed attention with a bias table, MBConv"),
    tm("sequencer2d_s", "bidirectional LSTMs over rows and columns"),
]
