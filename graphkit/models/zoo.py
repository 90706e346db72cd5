"""Small built-in models for demos, docs and tests.

Every model in the zoo is a function that takes no arguments and returns ``(module, inputs)``: an
``nn.Module`` and the inputs of one forward call, either a tuple of positional arguments or a dict of keyword
arguments. Input tensors with ``requires_grad=True`` are the *stage inputs* of the autograd graph; integer
token ids and tensors that need no gradient are ordinary inputs.

All models are tiny (a forward pass takes milliseconds on a CPU), float32, on the CPU, and deterministic:
parameters and inputs are drawn from a private seed inside :func:`torch.random.fork_rng`, so building a
model neither depends on nor changes the global random state. Two builds of the same model are equal, and two
forward calls on the same build give identical outputs (no dropout, no random op in any forward).

Each model exercises one kind of autograd graph that graph capture and parameter grouping must get right;
its docstring says which. The registry :data:`MODELS` maps a name to a :class:`ZooModel`; a model spec
``zoo:NAME`` (see :mod:`graphkit.models.specs`) loads one by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "ZooModel",
    "build",
    "chain",
    "conv_bn",
    "custom_function",
    "detached",
    "gpt",
    "gpt_ends",
    "gpt_stage",
    "lstm",
    "mlp",
    "param_only_output",
    "shared_late",
    "view_output",
    "weight_norm",
]

ModelInputs = tuple[Any, ...] | dict[str, Any]
"""Inputs of one forward call: positional arguments (tuple) or keyword arguments (dict)."""


@dataclass(slots=True, frozen=True)
class ZooModel:
    """One entry of the zoo registry.

    Attributes:
        name: the registry key, as used in the spec ``zoo:NAME``.
        build: function taking no arguments and returning ``(module, inputs)``.
        description: one line saying what the model is and which graph kind it exercises.
    """

    name: str
    build: Callable[[], tuple[nn.Module, ModelInputs]]
    description: str


MODELS: dict[str, ZooModel] = {}
"""Registry of the built-in models, by name, in the order they are defined."""

DEFAULT_MODEL = "gpt_ends"
"""The model that commands use when no spec is given."""

_SEED = 0


def _register(
    function: Callable[[], tuple[nn.Module, ModelInputs]],
) -> Callable[[], tuple[nn.Module, ModelInputs]]:
    """Add a model-building function to :data:`MODELS`; its docstring's first line is the description."""
    doc = (function.__doc__ or "").strip()
    description = doc.splitlines()[0].strip() if doc else function.__name__
    MODELS[function.__name__] = ZooModel(name=function.__name__, build=function, description=description)
    return function


def _seeded(
    make: Callable[[], tuple[nn.Module, ModelInputs]], seed: int = _SEED
) -> tuple[nn.Module, ModelInputs]:
    """Run ``make`` under a private CPU random state seeded with ``seed``; the global state is untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def build(name: str) -> tuple[nn.Module, ModelInputs]:
    """Build the zoo model called ``name`` and return ``(module, inputs)``.

    Raises:
        KeyError: ``name`` is not in :data:`MODELS`; the message lists the known names.
    """
    try:
        entry = MODELS[name]
    except KeyError:
        known = ", ".join(MODELS)
        raise KeyError(f"unknown zoo model {name!r}; known models: {known}") from None
    return entry.build()


# --------------------------------------------------------------------------------------------------------
# GPT-style transformer pieces


@dataclass(slots=True, frozen=True)
class GPTConfig:
    """Sizes of the tiny GPT-style models.

    Attributes:
        vocab_size: number of token ids.
        context_length: the longest sequence the position embedding covers.
        width: hidden size ``d`` (features per token).
        heads: attention heads; ``width`` must be divisible by it.
        layers: transformer blocks.
        batch: batch size of the example inputs.
        tokens: sequence length of the example inputs.
    """

    vocab_size: int = 64
    context_length: int = 8
    width: int = 32
    heads: int = 4
    layers: int = 2
    batch: int = 2
    tokens: int = 8


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused q/k/v projection.

    Input and output: float tensors of shape ``(batch, tokens, width)``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.width % config.heads:
            raise ValueError(f"width {config.width} is not divisible by heads {config.heads}")
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        mask = torch.ones(config.context_length, config.context_length, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, hidden: Tensor) -> Tensor:
        batch, tokens, width = hidden.shape
        head_width = width // self.heads
        query, key, value = self.qkv(hidden).split(width, dim=2)
        query = query.view(batch, tokens, self.heads, head_width).transpose(1, 2)
        key = key.view(batch, tokens, self.heads, head_width).transpose(1, 2)
        value = value.view(batch, tokens, self.heads, head_width).transpose(1, 2)
        scores = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(head_width))
        scores = scores.masked_fill(~self.causal_mask[:tokens, :tokens], float("-inf"))
        attended = scores.softmax(dim=-1) @ value
        attended = attended.transpose(1, 2).contiguous().view(batch, tokens, width)
        return self.proj(attended)


class MLP(nn.Module):
    """Two linear layers with a GELU between them: ``width -> 4 * width -> width``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * width, width)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(hidden)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``h + attn(ln1(h))``, then ``h + mlp(ln2(h))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.width)
        self.mlp = MLP(config.width)

    def forward(self, hidden: Tensor) -> Tensor:
        hidden = hidden + self.attn(self.ln1(hidden))
        return hidden + self.mlp(self.ln2(hidden))


class GPT(nn.Module):
    """A GPT-style language model whose LM head is tied to the token embedding.

    Input: token ids, int64 ``(batch, tokens)``. Output: logits, float32 ``(batch, tokens, vocab_size)``.
    ``lm_head.weight`` *is* ``wte.weight`` (one Parameter, two names).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.width)
        self.wpe = nn.Embedding(config.context_length, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, token_ids: Tensor) -> Tensor:
        tokens = token_ids.shape[1]
        if tokens > self.config.context_length:
            raise ValueError(
                f"sequence of {tokens} tokens exceeds context_length {self.config.context_length}"
            )
        positions = torch.arange(tokens, device=token_ids.device)
        hidden = self.wte(token_ids) + self.wpe(positions)
        for block in self.blocks:
            hidden = block(hidden)
        return self.lm_head(self.ln_f(hidden))


class GPTStage(nn.Module):
    """The transformer blocks of :class:`GPT` alone, as a middle pipeline stage.

    Input and output: hidden states, float32 ``(batch, tokens, width)``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))

    def forward(self, hidden: Tensor) -> Tensor:
        for block in self.blocks:
            hidden = block(hidden)
        return hidden


@_register
def gpt() -> tuple[nn.Module, ModelInputs]:
    """GPT-style first-and-last stage: token + position embedding, 2 blocks, LM head tied to the embedding.

    Graph kinds: integer inputs (no stage input needs grad, so every parameter is reached from the output
    alone), a tied weight used by two nodes far apart (``EmbeddingBackward0`` and the head's ``MmBackward0``
    reach one ``AccumulateGrad``, the head through ``TBackward0``), fused q/k/v with a three-way ``split``
    (a multi-output node), views and masks. Sizes: vocab 64, width 32, 4 heads, 2 layers.
    Inputs: ``(token_ids,)`` int64 ``(2, 8)``. Output: logits float32 ``(2, 8, 64)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        config = GPTConfig()
        model = GPT(config)
        token_ids = torch.randint(0, config.vocab_size, (config.batch, config.tokens))
        return model, (token_ids,)

    return _seeded(make)


@_register
def gpt_stage() -> tuple[nn.Module, ModelInputs]:
    """GPT-style middle stage: hidden states in, 2 pre-LN transformer blocks, hidden states out.

    Graph kinds: a stage input that requires grad, residual connections (a node whose output feeds
    several consumers), LayerNorm and attention intermediates. Inputs: ``(hidden,)`` float32 ``(2, 8, 32)``
    with ``requires_grad=True``. Output: float32 ``(2, 8, 32)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        config = GPTConfig()
        model = GPTStage(config)
        hidden = torch.randn(config.batch, config.tokens, config.width).requires_grad_()
        return model, (hidden,)

    return _seeded(make)


class GPTEnds(nn.Module):
    """The first and the last piece of :class:`GPT` on one device, as a V-shape zero-bubble schedule places them.

    Inputs: token ids, int64 ``(batch, tokens)``, and the hidden states coming back from the middle
    stages, float32 ``(batch, tokens, width)``. Outputs: ``{"embeddings", "logits"}``: the embedded tokens
    to send to the next stage, and the logits of the last block, final LayerNorm and LM head, whose weight
    *is* the token embedding's.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.width)
        self.wpe = nn.Embedding(config.context_length, config.width)
        self.last_block = Block(config)
        self.ln_f = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, token_ids: Tensor, hidden: Tensor) -> dict[str, Tensor]:
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        embeddings = self.wte(token_ids) + self.wpe(positions)
        logits = self.lm_head(self.ln_f(self.last_block(hidden)))
        return {"embeddings": embeddings, "logits": logits}


@_register
def gpt_ends() -> tuple[nn.Module, ModelInputs]:
    """GPT-style stage with a tied LM head: embedding out, last block and head in, as in a V-shape schedule.

    Graph kinds: a weight tied across the two ends of the model (``wte.weight`` is ``lm_head.weight``):
    the embedding output depends on parameters alone (a parameter-only output), the head's matmul is an
    intermediate on the input path, and the tied weight reaches both (a shared parameter); integer and
    float inputs side by side. Inputs: ``{"token_ids"}`` int64 ``(2, 8)`` and ``{"hidden"}`` float32
    ``(2, 8, 32)`` with ``requires_grad=True``. Outputs: ``{"embeddings": (2, 8, 32), "logits": (2, 8, 64)}``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        config = GPTConfig()
        model = GPTEnds(config)
        token_ids = torch.randint(0, config.vocab_size, (config.batch, config.tokens))
        hidden = torch.randn(config.batch, config.tokens, config.width).requires_grad_()
        return model, {"token_ids": token_ids, "hidden": hidden}

    return _seeded(make)


# --------------------------------------------------------------------------------------------------------
# Classic layers


@_register
def mlp() -> tuple[nn.Module, ModelInputs]:
    """Multi-layer perceptron: Linear(16, 32), GELU, Linear(32, 8).

    Graph kinds: the plain case, one parameter group per ``addmm`` and a bias each. Inputs: ``(x,)`` float32
    ``(4, 16)`` with ``requires_grad=True``. Output: float32 ``(4, 8)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
        x = torch.randn(4, 16).requires_grad_()
        return model, (x,)

    return _seeded(make)


class LSTMAll(nn.Module):
    """One-layer LSTM that returns all three of its outputs: ``(out, h, c)``.

    Input: float32 ``(batch, steps, 8)``. Outputs: ``out`` ``(batch, steps, 16)``, ``h`` and ``c``
    ``(1, batch, 16)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size=8, hidden_size=16, batch_first=True)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out, (h, c) = self.lstm(x)
        return out, h, c


@_register
def lstm() -> tuple[nn.Module, ModelInputs]:
    """LSTM returning (out, h, c): one fused RNN kernel node with several outputs, all of them stage outputs.

    Graph kinds: a multi-output intermediate whose outputs each carry their own gradient (summing them
    into output 0 is wrong). Inputs: ``(x,)`` float32 ``(2, 5, 8)`` with ``requires_grad=True``.
    Outputs: ``(out (2, 5, 16), h (1, 2, 16), c (1, 2, 16))``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = LSTMAll()
        x = torch.randn(2, 5, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)


@_register
def conv_bn() -> tuple[nn.Module, ModelInputs]:
    """Convolution block: Conv2d(3, 8), BatchNorm2d, ReLU, Conv2d(8, 4), in training mode.

    Graph kinds: convolution and batch-norm nodes, whose weight and bias gradients come out of one
    multi-output backward node each. Inputs: ``(x,)`` float32 ``(2, 3, 8, 8)`` with ``requires_grad=True``.
    Output: float32 ``(2, 4, 8, 8)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 4, kernel_size=3, padding=1),
        )
        x = torch.randn(2, 3, 8, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)


# --------------------------------------------------------------------------------------------------------
# Graph kinds on which split backward is known to be fragile


class Scale(nn.Module):
    """Holds one learned per-feature scale ``scale`` (float32 ``(features,)``), used by other modules."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(features) + 0.5)


class SharedLate(nn.Module):
    """Two linear layers that both use a parameter ``shared.scale`` registered after their own parameters.

    ``h = tanh(layer1(x) * s)``, ``y = layer2(h) * s`` with ``s = shared.scale``. ``named_parameters()``
    lists ``layer1.weight, layer1.bias, layer2.weight, layer2.bias, shared.scale`` in that order (a parameter
    registered directly on this module would come first, so the shared one lives in a submodule registered
    last). Input: float32 ``(batch, 8)``. Output: float32 ``(batch, 8)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer1 = nn.Linear(8, 8)
        self.layer2 = nn.Linear(8, 8)
        self.shared = Scale(8)

    def forward(self, x: Tensor) -> Tensor:
        scale = self.shared.scale
        hidden = torch.tanh(self.layer1(x) * scale)
        return self.layer2(hidden) * scale


@_register
def shared_late() -> tuple[nn.Module, ModelInputs]:
    """Two layers sharing a parameter that is registered after both layers' own parameters.

    Graph kinds: one parameter reaching intermediates of two layers, so the groups of both layers must
    merge transitively whatever the parameter order. ``named_parameters()`` lists ``layer1.*``, ``layer2.*``
    and then ``shared.scale``. Inputs: ``(x,)`` float32 ``(4, 8)`` with ``requires_grad=True``.
    Output: ``(4, 8)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = SharedLate()
        x = torch.randn(4, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)


class ParamOnlyOutput(nn.Module):
    """A linear layer plus a learned temperature returned as an output of its own.

    Input: float32 ``(batch, 8)``. Output: dict ``{"hidden": (batch, 8), "logit_scale": ()}`` where
    ``logit_scale = self.logit_scale.exp()`` depends on a parameter alone.
    """

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"hidden": self.linear(x), "logit_scale": self.logit_scale.exp()}


@_register
def param_only_output() -> tuple[nn.Module, ModelInputs]:
    """A stage returning a dict with its hidden output and a learned temperature logit_scale.exp().

    Graph kinds: a stage output in the weight-only subgraph (no stage input reaches it), which must still
    send a gradient to its parameter. Inputs: ``(x,)`` float32 ``(4, 8)`` with ``requires_grad=True``.
    Output: ``{"hidden": (4, 8), "logit_scale": ()}``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = ParamOnlyOutput()
        x = torch.randn(4, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)


class MatmulTanh(torch.autograd.Function):
    """Custom autograd Function with two outputs: ``y = x @ weight`` and ``t = tanh(x @ weight)``.

    Shapes: ``x`` ``(batch, n)``, ``weight`` ``(n, m)``, both outputs ``(batch, m)``. The backward is
    written by hand: with ``g = grad_y + grad_t * (1 - t**2)``, ``grad_x = g @ weight.T`` and
    ``grad_weight = x.T @ g``.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        y = x @ weight
        t = torch.tanh(y)
        ctx.save_for_backward(x, weight, t)
        return y, t

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor, grad_t: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, weight, t = ctx.saved_tensors
        # under autocast the outputs (and their gradients) may be in a lower precision than x and weight
        grad = (grad_y + grad_t * (1 - t * t)).to(weight.dtype)
        grad_x = grad @ weight.transpose(0, 1) if ctx.needs_input_grad[0] else None
        grad_weight = x.transpose(0, 1) @ grad if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight


class CustomFunctionModel(nn.Module):
    """``y, t = MatmulTanh(x, weight)``, then ``head(t) + y``: both outputs of the custom node are used.

    Input: float32 ``(batch, 8)``. Output: float32 ``(batch, 8)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8) / math.sqrt(8))
        self.head = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        y, t = MatmulTanh.apply(x, self.weight)
        return self.head(t) + y


@_register
def custom_function() -> tuple[nn.Module, ModelInputs]:
    """A custom torch.autograd.Function with two outputs and a hand-written backward.

    Graph kinds: a multi-output custom node (``MatmulTanhBackward``); graphkit sets its ``needs_input_grad``
    per phase (the input path in B, the weight in W). Inputs: ``(x,)`` float32 ``(4, 8)`` with
    ``requires_grad=True``. Output: ``(4, 8)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = CustomFunctionModel()
        x = torch.randn(4, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)


class Chain(nn.Module):
    """One weight used three times in a chain: ``h = tanh(h @ weight)``, three times.

    Input and output: float32 ``(batch, 8)``.
    """

    def __init__(self, steps: int = 3) -> None:
        super().__init__()
        self.steps = steps
        self.weight = nn.Parameter(torch.randn(8, 8) / math.sqrt(8))

    def forward(self, x: Tensor) -> Tensor:
        hidden = x
        for _ in range(self.steps):
            hidden = torch.tanh(hidden @ self.weight)
        return hidden


@_register
def chain() -> tuple[nn.Module, ModelInputs]:
    """One weight used three times in a chain h = tanh(h @ W), like a recurrence or a shared bias.

    Graph kinds: one ``AccumulateGrad`` fed by three ``MmBackward0`` nodes that lie on the input path one
    after another. Inputs: ``(x,)`` float32 ``(4, 8)`` with ``requires_grad=True``. Output: ``(4, 8)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = Chain()
        x = torch.randn(4, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)


class ViewOutput(nn.Module):
    """A 3-D linear layer returning its output and a transposed view of it.

    Input: float32 ``(batch, tokens, 8)``. Outputs: ``y`` ``(batch, tokens, 6)`` (itself a view of the
    ``addmm`` result) and ``y.transpose(1, 2)`` ``(batch, 6, tokens)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 6)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        y = self.linear(x)
        return y, y.transpose(1, 2)


@_register
def view_output() -> tuple[nn.Module, ModelInputs]:
    """A 3-D Linear output and a transposed view of it, both returned as stage outputs.

    Graph kinds: a stage output that is a view (``TransposeBackward0``), on which an in-place ``detach_()``
    raises, beside the view's base. That base, the Linear's output, is addmm's output reshaped: a view too up
    to torch 2.14 (``ViewBackward0``); from torch 2.15 an ``_unsafe_view``, which is no view
    (``UnsafeViewBackward0``). Inputs: ``(x,)`` float32 ``(2, 5, 8)`` with ``requires_grad=True``.
    Outputs: ``((2, 5, 6), (2, 6, 5))``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = ViewOutput()
        x = torch.randn(2, 5, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)


class WeightNormLinear(nn.Module):
    """Linear layer with a normalised weight: ``x @ (weight / weight.norm()).T + bias``.

    Input: float32 ``(batch, 8)``. Output: float32 ``(batch, 8)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))
        self.bias = nn.Parameter(torch.zeros(8))

    def forward(self, x: Tensor) -> Tensor:
        return functional.linear(x, self.weight / self.weight.norm(), self.bias)


@_register
def weight_norm() -> tuple[nn.Module, ModelInputs]:
    """A parameter that reaches the input path only through a weight-only chain W / W.norm().

    Graph kinds: weight-only nodes (``LinalgVectorNormBackward0``, ``DivBackward0``, ``TBackward0``) between
    the parameter and the intermediate that meets the input. Inputs: ``(x,)`` float32 ``(4, 8)`` with
    ``requires_grad=True``. Output: ``(4, 8)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = WeightNormLinear()
        x = torch.randn(4, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)


class Detached(nn.Module):
    """A detached branch and an in-place op.

    ``h = relu_(first(x))`` (in place on the linear output), ``side = side(h.detach())`` (its parameters get
    gradients, but no gradient flows back into ``h`` through it), ``y = second(h) + side``.
    Input and output: float32 ``(batch, 8)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.side = nn.Linear(8, 8)
        self.second = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.first(x)
        hidden.relu_()
        side = self.side(hidden.detach())
        return self.second(hidden) + side


@_register
def detached() -> tuple[nn.Module, ModelInputs]:
    """A detached branch plus an in-place ReLU.

    Graph kinds: an in-place op (``ReluBackward0`` replacing the linear output's ``grad_fn``) and a
    parameterised branch fed by a detached tensor, whose parameters are reached from the output alone.
    Inputs: ``(x,)`` float32 ``(4, 8)`` with ``requires_grad=True``. Output: ``(4, 8)``.
    """

    def make() -> tuple[nn.Module, ModelInputs]:
        model = Detached()
        x = torch.randn(4, 8).requires_grad_()
        return model, (x,)

    return _seeded(make)
