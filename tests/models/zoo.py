"""The models of the sweep (tests/models/sweep.py): what a model is to the sweep, how it is made
comparable, and the lists.

A :class:`Spec` names a model (``tv/resnet18``, ``timm/poolformer_s12``, ``hf/bert``), the library
it comes from, a function building it with random weights, and what it takes as input. Nothing is
downloaded: every model is built from its library's code and a configuration.

:func:`build` makes a built model comparable, the same way for every library:

- **Nothing random in the forward pass.** Dropout, drop-path and stochastic depth are set to zero
  (modules' ``p`` / ``drop_prob`` and every float attribute whose name says ``drop``), so eager,
  float64 eager and kiln run one network in training too.
- **Every parameter counts.** A parameter whose elements are all equal (zero-initialised
  classifier heads and last batch norms of a residual block, layer-scale gammas of 1e-6, norm
  weights of one and biases of zero) gets noise of a tenth of its size (at least 0.1): a residual
  branch scaled by 1e-6 hides any error in it from the output, a zero head makes every output
  zero, and a bias of zero hides a bias add done wrong.
- **Batch norms see their data.** Running statistics are those of a batch of 16 random inputs
  like the checked ones (one training-mode forward, a cumulative average), so that activations
  stay of order one through a deep network in eval mode. Fewer samples leave channels whose
  variance was near zero by chance to scale later inputs up by orders of magnitude (with 4
  images, EfficientNetV2's outputs reached 1e4 and float32 eager was 1e-2 off float64; with the
  checked batch itself, the last stages' 2x2 maps normalise 8 values per channel).

:data:`SAMPLE` is the CPU sample CI runs (tests/python/test_model_sweep.py), chosen for op
coverage; :func:`specs` returns a list by name (``sample``, ``full``, ``selftest``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

VOCAB = 320  # the vocabulary of every text model: small embeddings, ids of any family


@dataclass(frozen=True)
class Spec:
    """One model of the sweep.

    ``make()`` returns the model with random weights, on the CPU in float32 (:func:`build` does
    the rest). ``kind`` says what it takes: ``image`` (``pixel_values``-like: one positional
    tensor of ``batch x 3 x side x side``, or the keyword ``input_key``), ``text`` (``input_ids``
    and, with ``mask``, an ``attention_mask`` whose second row ends in padding), ``seq2seq`` (text plus
    ``decoder_input_ids`` of half the length), ``audio`` (``input_values``, ``samples`` long),
    ``features`` (``input_features``, ``channels x frames``). Text models run at ``lengths``
    (the second is the dynamic-shape mode's). Training steps take ``train_batch`` samples: a batch
    norm over the batch alone (LeViT's head norms pooled features, BatchNorm1d) normalises a
    difference of two nearly equal numbers at two samples, float32 eager then 3e-3 off float64.
    ``drop`` builds the model with dropout or drop-path on, for the ``train-drop`` mode; ``covers``
    says what the model is in the list for; ``time_limit`` caps the sweep's time limit for it.
    """

    name: str
    library: str
    make: Callable[[], torch.nn.Module]
    kind: str = "image"
    side: int = 64
    batch: int = 2
    train_batch: int = 4
    lengths: tuple[int, int] = (24, 17)
    mask: bool = True
    input_key: Optional[str] = None
    samples: int = 4000
    channels: int = 16
    frames: int = 32
    covers: str = ""
    drop: Optional[Callable[[], torch.nn.Module]] = None
    time_limit: Optional[float] = None  # seconds; the sweep's --time-limit when less
    # Selftest specs only: a function run in the worker before a mode (a planted bug).
    plant: Optional[Callable[[str], Any]] = field(default=None, compare=False)

    @property
    def is_text(self) -> bool:
        return self.kind in ("text", "seq2seq")


# ------------------------------------------------------------------------------ preparing

def _no_randomness(model: torch.nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for key, value in list(vars(m).items()):
            if isinstance(value, float) and "drop" in key.lower():
                setattr(m, key, 0.0)
        if type(m).__name__ == "StochasticDepth":  # torchvision
            m.p = 0.0


@torch.no_grad()
def _perturb_constant_parameters(model: torch.nn.Module, gen: torch.Generator) -> None:
    for p in model.parameters():
        if not p.is_floating_point() or p.numel() == 0:
            continue
        first = p.reshape(-1)[0]
        if bool((p == first).all()):
            scale = max(abs(float(first)), 1.0) * 0.1
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)


@torch.no_grad()
def _calibrate_batch_norms(model: torch.nn.Module, spec: Spec) -> None:
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average: this batch's statistics
    model.train()
    args, kwargs = inputs(spec, seed=2, batch=16)
    model(*args, **kwargs)
    for m in norms:
        m.momentum = 0.1


def build(spec: Spec, drop: bool = False) -> torch.nn.Module:
    """``spec``'s model, made comparable (module docstring), in eval mode, float32 on the CPU.
    With ``drop``: the ``train-drop`` variant, dropout and drop-path left on."""
    torch.manual_seed(0)
    make = spec.drop if drop and spec.drop is not None else spec.make
    model = make()
    if not drop:
        _no_randomness(model)
    _perturb_constant_parameters(model, torch.Generator().manual_seed(7))
    _calibrate_batch_norms(model, spec)
    return model.eval()


# --------------------------------------------------------------------------------- inputs

def inputs(spec: Spec, length: Optional[int] = None, seed: int = 1, batch: Optional[int] = None
           ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Positional and keyword inputs of ``spec``'s model (float32, CPU); ``length`` for text."""
    gen = torch.Generator().manual_seed(seed)
    b = batch or spec.batch
    if spec.kind == "image":
        x = torch.randn(b, 3, spec.side, spec.side, generator=gen)
        return ([], {spec.input_key: x}) if spec.input_key else ([x], {})
    if spec.kind == "audio":
        return [], {"input_values": torch.randn(b, spec.samples, generator=gen)}
    if spec.kind == "features":
        return [], {"input_features": torch.randn(b, spec.channels, spec.frames, generator=gen)}
    n = length or spec.lengths[0]
    kw = {"input_ids": torch.randint(3, VOCAB, (b, n), generator=gen)}
    if spec.mask:
        mask = torch.ones(b, n, dtype=torch.long)
        if b > 1:  # a padded row; its last 3 places only, so that a local attention window (GPT-Neo's)
            mask[1, n - 3:] = 0  # never holds padding alone, a row that only padding fills being noise
        kw["attention_mask"] = mask
    if spec.kind == "seq2seq":
        kw["decoder_input_ids"] = torch.randint(3, VOCAB, (b, max(n // 2, 2)), generator=gen)
    return [], kw


def tensors(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a model's output, in order (Hugging Face outputs as
    tuples; caches and other objects skipped)."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for x in out for t in tensors(x)]
    return []


# ---------------------------------------------------------------------------------- lists

def library_missing(library: str) -> Optional[str]:
    """Why models of ``library`` cannot run here, or None."""
    module = {"torchvision": "torchvision", "timm": "timm", "transformers": "transformers"}.get(library)
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    return None


def all_specs() -> dict[str, Spec]:
    """Every model the sweep knows (the full list and the selftest), by name."""
    from zoo_hf import HF
    from zoo_selftest import SELFTEST
    from zoo_vision import TIMM, TORCHVISION

    out: dict[str, Spec] = {}
    for group in (TORCHVISION, TIMM, HF, SELFTEST):
        for s in group:
            assert s.name not in out, s.name
            out[s.name] = s
    return out


# The CPU sample CI runs: ops first (a family adds to the sample only for what the others lack).
SAMPLE = [
    "tv/resnet18",             # batch norm, ReLU, max pool, residual adds, adaptive average pool
    "tv/mobilenet_v3_small",   # hardswish, hardsigmoid, squeeze-excitation, depthwise convolutions
    "tv/shufflenet_v2_x0_5",   # channel shuffle: view, transpose, view; chunk; cat
    "tv/squeezenet1_1",        # ceil-mode pooling, concatenated branches
    "tv/vit",                  # class token, MultiheadAttention
    "timm/convnext_atto",      # LayerNorm2d (permuted layer norm), layer scale
    "timm/convnextv2_atto",    # global response norm
    "timm/tf_efficientnet_b0",  # "same" padding (pad before each convolution), SiLU, SE
    "timm/ecaresnet26t",       # ECA: conv1d over pooled channels, deep stem, average-pool downsample
    "timm/levit_128s",         # attention with a learned bias table, hardswish, BatchNorm1d
    "timm/mobilevit_xxs",      # unfold into patches and fold back around a transformer
    "timm/mixer_s16_224",      # MLP-mixer: token mixing over transposed patches
    "timm/swinv2_cr_tiny_ns_224",  # shifted windows (roll), cosine attention, continuous position bias
    "timm/beit_base_patch16_224",  # relative position bias table, layer scale
    "hf/bert",                 # encoder with a padded attention mask, GELU, two lengths
    "hf/gpt2",                 # causal decoder, two lengths
    "hf/llama",                # rotary embeddings, grouped-query attention, RMSNorm, SiLU gate
    "hf/t5",                   # encoder-decoder, relative position buckets, RMS layer norm
    "hf/wav2vec2",             # convolutional feature encoder, group norm, positional conv
    "hf/segformer",            # efficient self-attention (reduced keys), mix-FFN, upsampling head
]

# A list of tests of the sweep itself: a crash, a hang, a wrong lowering, a refused part.
SELFTEST = ["self/ok", "self/crash", "self/hang", "self/raise", "self/wrong", "self/refused"]


def specs(which: str) -> list[Spec]:
    """The specs of a list: ``sample``, ``full`` (every model but the selftest's) or
    ``selftest``."""
    every = all_specs()
    if which == "sample":
        return [every[n] for n in SAMPLE]
    if which == "selftest":
        return [every[n] for n in SELFTEST]
    if which == "full":
        return [s for s in every.values() if s.library != "selftest"]
    raise ValueError(f"unknown list {which!r}: sample, full or selftest")
