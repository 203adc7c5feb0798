"""kiln's torch.compile backend on real model architectures: Hugging Face ``transformers``
models of a dozen families (encoders, decoders with rotary embeddings and grouped-query
attention, encoder-decoders, vision transformers, convnets), built from small configurations
with random weights (nothing is downloaded), run on the CPU.

Each model's inference outputs and the gradients of a training step (a randomly weighted sum
of its output, dropout off) are compared with eager, and no kiln part may fall back to torch.
A few decoders also run at several sequence lengths with padding in the batch (torch's
automatic dynamic shapes: one symbolic graph serves every later length).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Iterator

import pytest

from helpers import import_torch

torch = import_torch()
try:
    import transformers  # noqa: F401
except ImportError as e:  # deploy/setup.sh installs it: a run without it must not pass
    if os.environ.get("KILN_SKIP_TORCH") == "1":
        pytest.skip("transformers is not installed (KILN_SKIP_TORCH=1)", allow_module_level=True)
    raise ImportError("these tests need transformers (deploy/setup.sh installs it)") from e

import kiln.torch as kt  # noqa: E402
from model_zoo import MODELS, build, inputs, tensors  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    kt.reset_stats()
    kt.clear_memo()
    yield
    torch._dynamo.reset()


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    # Relative to the tensor's scale: reductions reassociate (vector lanes, threads).
    scale = 1.0 + want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5 * scale, msg=lambda m: f"{what}: {m}")


def compile_model(model: torch.nn.Module, client: Any) -> Callable[..., Any]:
    return torch.compile(model, backend="kiln", options={"client": client})


def assert_all_in_kiln(caught: list[warnings.WarningMessage]) -> None:
    s = kt.stats()
    assert s["failed"] == 0, [str(w.message) for w in caught if issubclass(w.category, kt.KilnFallbackWarning)]
    assert s["compiled"] >= 1 and s["kernel_calls"] >= 1, s


@pytest.mark.parametrize("name", list(MODELS))
def test_inference_and_training_step_match_eager(client: Any, name: str) -> None:
    model = build(name)
    x = inputs(name)
    with warnings.catch_warnings(record=True) as caught:  # and transformers' notes about small configs
        warnings.simplefilter("always")
        with torch.no_grad():
            want = tensors(model(**x))
            got = tensors(compile_model(model, client)(**x))
        assert len(got) == len(want) > 0
        for i, (g, w) in enumerate(zip(got, want)):
            close(g, w, f"{name} output {i}")

        # A training step: gradients of a randomly weighted sum of the first output.
        model.train()
        torch._dynamo.reset()
        out = tensors(compile_model(model, client)(**x))[0]
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        (out * weights).sum().backward()
        got_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        (tensors(model(**x))[0] * weights).sum().backward()
    want_grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert want_grads and set(want_grads) <= set(got_grads), set(want_grads) - set(got_grads)
    for k, w in want_grads.items():
        close(got_grads[k], w, f"{name} gradient of {k}")
    assert_all_in_kiln(caught)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bart"])
def test_decoders_at_several_lengths_with_padding(client: Any, name: str) -> None:
    """One static graph for the first length, then one symbolic graph for every later one;
    rows padded by the attention mask. BART's decoder shifts its input right (a slice of the
    symbolic length), which runs beside the kiln parts."""
    model = build(name)
    compiled = compile_model(model, client)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for length in (24, 17, 31, 9):
            x = inputs(name, length)
            mask = torch.ones_like(x["input_ids"])
            mask[1, length // 2:] = 0
            want = tensors(model(**x, attention_mask=mask))
            got = tensors(compiled(**x, attention_mask=mask))
            for i, (g, w) in enumerate(zip(got, want)):
                close(g, w, f"{name} at length {length}, output {i}")
    s = kt.stats()
    assert s["graphs"] == 2, s
    assert_all_in_kiln(caught)
