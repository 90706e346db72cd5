"""Small models for graphkit's tests, one function per kind of autograd graph.

Every function returns ``(module, inputs)`` where ``inputs`` is a dict of keyword arguments for
``module(**inputs)``. Float inputs with ``requires_grad=True`` are stage inputs; integer ids and float
tensors without ``requires_grad`` are ordinary inputs. Parameters and inputs come from a private seed
(:func:`torch.random.fork_rng`), so two builds of one kind are equal and the global random state is untouched.
The kinds the zoo already has (:mod:`graphkit.models.zoo`: ``lstm``, ``chain``, ``view_output``,
``weight_norm``, and its ``Chain`` for :func:`recurrence`) are the zoo's models, with the zoo's seed.

The kinds follow the graphs on which split backward is known to go wrong: a parameter shared by two layers
and registered after them, a parameter-only output, multi-output nodes (custom ``autograd.Function``, LSTM),
one weight used three times in a chain, view outputs, integer and no-grad inputs, a detached branch, an
in-place op, a weight-only chain ``W / W.norm()``. :func:`random_model` draws random small DAGs of
linear, elementwise and reduction ops for property tests. :func:`reregister` rebuilds a module with its
parameters and submodules registered in another order, which changes ``named_parameters()`` and nothing
else.

:func:`reference_param_groups` is a brute-force oracle for parameter groups, written straight from
``next_functions`` (per-parameter closures and a union-find), independent of :mod:`graphkit.analysis.closures`;
:func:`check_param_groups` asserts that :func:`graphkit.param_groups` agrees with it and with a full
backward.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import Node, get_gradient_edge
from torch.nn import functional

from graphkit.analysis.parameter_groups import GroupFlag, ParamGroup, ParamGroups, param_groups
from graphkit.graph.autograd_graph import capture
from graphkit.models import zoo

__all__ = [
    "KINDS",
    "ModelAndInputs",
    "RandomModel",
    "RandomModelPlan",
    "ReferenceGroup",
    "chain",
    "check_param_groups",
    "chunk_pair",
    "custom_multi_output",
    "detached_branch",
    "in_place",
    "integer_inputs",
    "linear",
    "lstm",
    "nested",
    "output_tensors",
    "param_only_output",
    "parameters_with_gradient",
    "partition",
    "plan_random_model",
    "random_model",
    "recurrence",
    "reference_param_groups",
    "reregister",
    "run",
    "shared_late",
    "square",
    "transformer_encoder",
    "view_outputs",
    "weight_norm",
]

ModelAndInputs = tuple[nn.Module, dict[str, Any]]
"""A module and the keyword arguments of one forward call."""

_SEED = 1234


def _seeded(make: Callable[[], ModelAndInputs], seed: int = _SEED) -> ModelAndInputs:
    """Run ``make`` under a private CPU random state seeded with ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def _from_zoo(name: str) -> ModelAndInputs:
    """The zoo model ``name`` (:mod:`graphkit.models.zoo`, its own seed) with its one input as the keyword ``x``."""
    module, (x,) = zoo.build(name)
    return module, {"x": x}


def run(module: nn.Module, inputs: dict[str, Any]) -> Any:
    """``module(**inputs)``: one forward call."""
    return module(**inputs)


def output_tensors(outputs: Any) -> list[Tensor]:
    """The tensors of a nested output (tensor, sequence, mapping) that require grad, depth first."""
    found: list[Tensor] = []
    stack = [outputs]
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            if item.requires_grad:
                found.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
    return found


# --------------------------------------------------------------------------------------------------------
# Hand-sized graphs for capture


class Square(nn.Module):
    """``y = x * x``: one MulBackward0 with two parallel edges to the same input. No parameters."""

    def forward(self, x: Tensor) -> Tensor:
        return x * x


def square() -> ModelAndInputs:
    """``x * x`` on ``x`` float32 ``(3,)`` requiring grad: two nodes, two parallel edges."""
    return _seeded(lambda: (Square(), {"x": torch.randn(3).requires_grad_()}))


def linear() -> ModelAndInputs:
    """``nn.Linear(4, 3)`` on ``x`` float32 ``(2, 4)``: AddmmBackward0(bias, x, TBackward0(weight))."""
    return _seeded(lambda: (nn.Linear(4, 3), {"input": torch.randn(2, 4).requires_grad_()}))


class ChunkPair(nn.Module):
    """``a, b = x.chunk(2, -1)``; ``y = tanh(a) + sigmoid(b)``: a SplitBackward0 with both outputs used.

    Input ``x`` float32 ``(2, 4)``; output ``(2, 2)``.
    """

    def forward(self, x: Tensor) -> Tensor:
        first, second = x.chunk(2, dim=-1)
        return torch.tanh(first) + torch.sigmoid(second)


def chunk_pair() -> ModelAndInputs:
    """A chunk whose two outputs are consumed (output_nr 0 by tanh, 1 by sigmoid)."""
    return _seeded(lambda: (ChunkPair(), {"x": torch.randn(2, 4).requires_grad_()}))


class Inner(nn.Module):
    """``relu(proj(x))``: a Linear inside a block, for module paths."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.proj(x))


class Nested(nn.Module):
    """``head(x * blocks[1](blocks[0](x)).sigmoid())``: two levels of submodules and a root-level op.

    Input ``x`` float32 ``(2, 4)``; output ``(2, 2)``. Module paths: ``blocks.0.proj``, ``blocks.0``,
    ``blocks.1.proj``, ``blocks.1``, ``""`` (the ``mul`` and ``sigmoid``), ``head``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Inner(), Inner()])
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        hidden = x
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(x * hidden.sigmoid())


def nested() -> ModelAndInputs:
    """Nested submodules for module-path tests."""
    return _seeded(lambda: (Nested(), {"x": torch.randn(2, 4).requires_grad_()}))


def recurrence(steps: int = 2000) -> ModelAndInputs:
    """A ``steps``-long recurrence ``h = tanh(h @ weight)`` (:class:`graphkit.models.zoo.Chain`) on ``x`` float32
    ``(2, 8)``: a deep, narrow graph of ``2 * steps + 2`` nodes and ``3 * steps`` edges (torchviz's recursive
    walk overflows on it)."""
    return _seeded(lambda: (zoo.Chain(steps), {"x": torch.randn(2, 8).requires_grad_()}))


def transformer_encoder(layers: int = 12, *, batch: int = 2, tokens: int = 4) -> ModelAndInputs:
    """``nn.TransformerEncoder`` of ``layers`` post-LN layers (d_model 16, 2 heads, feed-forward 16).

    No dropout, training mode (the slow path that builds a real autograd graph). Input ``src`` float32
    ``(batch, tokens, 16)`` requiring grad; output the same shape. About 56 nodes per layer.
    """

    def make() -> ModelAndInputs:
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        return encoder, {"src": torch.randn(batch, tokens, 16).requires_grad_()}

    return _seeded(make)


# --------------------------------------------------------------------------------------------------------
# The graph kinds of parameter groups


class Shared(nn.Module):
    """Holds one parameter, ``scale`` ``(4,)``, that other modules use."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(4) + 0.5)


class SharedLate(nn.Module):
    """``y = second(tanh(first(x) * shared.scale)) * shared.scale``: one parameter used by both layers.

    With ``shared_first=False`` (the hard case) ``shared.scale`` is registered after ``first.*`` and
    ``second.*``, so ``named_parameters()`` lists it last. Input ``x`` float32 ``(3, 4)``; output ``(3, 4)``.
    """

    def __init__(self, shared_first: bool = False) -> None:
        super().__init__()
        shared = Shared()
        if shared_first:
            self.shared = shared
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)
        if not shared_first:
            self.shared = shared

    def forward(self, x: Tensor) -> Tensor:
        scale = self.shared.scale
        return self.second(torch.tanh(self.first(x) * scale)) * scale


def shared_late(shared_first: bool = False) -> ModelAndInputs:
    """A parameter shared by two layers, registered after their own parameters (or before)."""
    return _seeded(lambda: (SharedLate(shared_first), {"x": torch.randn(3, 4).requires_grad_()}))


class ParamOnlyOutput(nn.Module):
    """``{"hidden": linear(x), "temperature": log_temperature.exp()}``: the second depends on a parameter alone.

    Input ``x`` float32 ``(3, 4)``; outputs ``(3, 4)`` and ``()``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.log_temperature = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"hidden": self.linear(x), "temperature": self.log_temperature.exp()}


def param_only_output() -> ModelAndInputs:
    """A stage output that depends on a parameter alone (a learned temperature)."""
    return _seeded(lambda: (ParamOnlyOutput(), {"x": torch.randn(3, 4).requires_grad_()}))


class ScaleAndShift(torch.autograd.Function):
    """Two outputs: ``x * weight`` and ``x + weight`` (``x`` ``(batch, n)``, ``weight`` ``(n,)``)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(x, weight)
        return x * weight, x + weight

    @staticmethod
    def backward(ctx: Any, grad_scaled: Tensor, grad_shifted: Tensor) -> tuple[Tensor, Tensor]:
        x, weight = ctx.saved_tensors
        grad_x = grad_scaled * weight + grad_shifted
        grad_weight = (grad_scaled * x + grad_shifted).sum(0)
        return grad_x, grad_weight


class CustomMultiOutput(nn.Module):
    """``scaled, shifted = ScaleAndShift(x, weight)``; ``y = scaled * shifted.tanh()``.

    Both outputs of the custom node carry a different gradient. Input ``x`` float32 ``(3, 4)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4))

    def forward(self, x: Tensor) -> Tensor:
        scaled, shifted = ScaleAndShift.apply(x, self.weight)
        return scaled * shifted.tanh()


def custom_multi_output() -> ModelAndInputs:
    """A custom ``autograd.Function`` with two outputs and a parameter input."""
    return _seeded(lambda: (CustomMultiOutput(), {"x": torch.randn(3, 4).requires_grad_()}))


def lstm() -> ModelAndInputs:
    """An LSTM whose fused kernel node has three outputs, all of them stage outputs (``zoo:lstm``)."""
    return _from_zoo("lstm")


def chain() -> ModelAndInputs:
    """One weight used three times in a chain: ``h = tanh(h @ W)`` three times (``zoo:chain``)."""
    return _from_zoo("chain")


def view_outputs() -> ModelAndInputs:
    """Stage outputs that are views (ViewBackward0, TransposeBackward0) (``zoo:view_output``)."""
    return _from_zoo("view_output")


class IntegerInputs(nn.Module):
    """``proj(embedding(token_ids) * mask)``: integer ids and a float mask that needs no grad.

    Inputs ``token_ids`` int64 ``(2, 3)``, ``mask`` float32 ``(2, 3, 1)`` (no grad); output ``(2, 3, 4)``.
    No stage input requires grad, so the input closure is empty (a first pipeline stage).
    """

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(7, 4)
        self.proj = nn.Linear(4, 4)

    def forward(self, token_ids: Tensor, mask: Tensor) -> Tensor:
        return self.proj(self.embedding(token_ids) * mask)


def integer_inputs() -> ModelAndInputs:
    """Integer and no-grad inputs: stage 0, every parameter reached from the outputs."""

    def make() -> ModelAndInputs:
        inputs = {"token_ids": torch.randint(0, 7, (2, 3)), "mask": torch.rand(2, 3, 1)}
        return IntegerInputs(), inputs

    return _seeded(make)


class DetachedBranch(nn.Module):
    """``y = main(x) + side(main(x).detach())``: ``side`` sees no stage input.

    Input ``x`` float32 ``(3, 4)``; output ``(3, 4)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Linear(4, 4)
        self.side = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.main(x)
        return hidden + self.side(hidden.detach())


def detached_branch() -> ModelAndInputs:
    """A parameterised branch fed by a detached tensor: its parameters are weight-only up to the add."""
    return _seeded(lambda: (DetachedBranch(), {"x": torch.randn(3, 4).requires_grad_()}))


class InPlace(nn.Module):
    """``h = first(x); h.mul_(gain); y = second(h)``: an in-place multiply by a parameter.

    The in-place ``mul_`` replaces ``h``'s grad_fn with a MulBackward0 whose inputs are the addmm and
    ``gain``. Input ``x`` float32 ``(3, 4)``; output ``(3, 4)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.gain = nn.Parameter(torch.rand(4) + 0.5)
        self.second = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.first(x)
        hidden.mul_(self.gain)
        return self.second(hidden)


def in_place() -> ModelAndInputs:
    """An in-place op on the input path that also uses a parameter."""
    return _seeded(lambda: (InPlace(), {"x": torch.randn(3, 4).requires_grad_()}))


def weight_norm() -> ModelAndInputs:
    """A parameter that reaches the input path only through the weight-only chain ``W / W.norm()``
    (``zoo:weight_norm``)."""
    return _from_zoo("weight_norm")


KINDS: dict[str, Callable[[], ModelAndInputs]] = {
    "square": square,
    "linear": linear,
    "chunk_pair": chunk_pair,
    "nested": nested,
    "shared_late": shared_late,
    "param_only_output": param_only_output,
    "custom_multi_output": custom_multi_output,
    "lstm": lstm,
    "chain": chain,
    "view_outputs": view_outputs,
    "integer_inputs": integer_inputs,
    "detached_branch": detached_branch,
    "in_place": in_place,
    "weight_norm": weight_norm,
}
"""Every small kind above by name (the deep ones, :func:`recurrence` and :func:`transformer_encoder`, are
left out)."""


def reregister(module: nn.Module, rng: random.Random) -> nn.Module:
    """Shuffle, in place, the registration order of every submodule's parameters and children.

    The computation is unchanged (same Parameter objects, same forward); only the order of
    ``named_parameters()`` and ``named_modules()`` changes. Children of containers whose forward follows
    their order (``nn.Sequential``, ``nn.ModuleList``, ``nn.ModuleDict``) keep it. A Parameter registered
    under several names keeps all of them. Returns ``module``.
    """
    ordered = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    for submodule in list(module.modules()):
        registries = [submodule._parameters]
        if not isinstance(submodule, ordered):
            registries.append(submodule._modules)
        for registry in registries:
            items = list(registry.items())
            rng.shuffle(items)
            registry.clear()
            registry.update(items)
    return module


# --------------------------------------------------------------------------------------------------------
# Random models for property tests


class _Choices:
    """Random choices from a ``random.Random`` or from a hypothesis ``data`` object (which can shrink)."""

    def __init__(self, source: Any) -> None:
        if isinstance(source, int):
            source = random.Random(source)
        self.source = source

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``, both ends included."""
        if isinstance(self.source, random.Random):
            return self.source.randint(low, high)
        from hypothesis import strategies

        return self.source.draw(strategies.integers(low, high))

    def boolean(self) -> bool:
        return self.integer(0, 1) == 1

    def pick(self, options: Sequence[Any]) -> Any:
        return options[self.integer(0, len(options) - 1)]


WIDTH = 4
BATCH = 3

UNARY_OPS = ("tanh", "sigmoid", "square", "relu", "exp_neg")
BINARY_OPS = ("add", "mul", "sub")
REDUCTION_OPS = ("sum_last", "mean_first", "norm")
# matmul, linear and binary ops are listed twice: they are drawn twice as often as the others.
OP_KINDS = (
    "matmul",
    "matmul",
    "linear",
    "linear",
    "unary",
    "binary",
    "binary",
    "reduce",
    "chunk",
    "detach",
    "in_place",
    "transpose",
)


# custom Functions (drawn with custom_functions=True): HonestMatmul, HonestMul, StopsSecond and Double
CUSTOM_UNARY_OPS = ("custom_double", "custom_double_unmaterialized")
CUSTOM_OPS = (
    ("matmul", "custom"),
    ("binary", "custom"),
    ("binary", "custom_stops_second"),
    *(("unary", variant) for variant in CUSTOM_UNARY_OPS),
)


@dataclass(slots=True, frozen=True)
class RandomOp:
    """One op of a random model: ``kind`` (see ``OP_KINDS``), ``variant`` and operand value indices."""

    kind: str
    variant: str
    operands: tuple[int, ...]


@dataclass(slots=True)
class RandomModelPlan:
    """What a :class:`RandomModel` computes.

    Values are numbered: first the inputs, then the parameters (each parameter is a value), then one value
    per op. ``param_shapes[i]`` is the shape of parameter ``i``; ``param_names[i]`` its names (two names:
    a tied parameter registered twice). ``outputs`` are value indices, returned as a tuple.
    """

    input_requires_grad: list[bool]
    param_shapes: list[tuple[int, ...]]
    param_names: list[list[str]]
    ops: list[RandomOp] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    registration_order: list[int] = field(default_factory=list)

    @property
    def num_inputs(self) -> int:
        return len(self.input_requires_grad)


def plan_random_model(source: Any, *, max_ops: int = 12, custom_functions: bool = False) -> RandomModelPlan:
    """Draw a random model plan.

    Args:
        source: a ``random.Random``, an int seed, or a hypothesis ``data`` object (``st.data()``).
        max_ops: most ops in the DAG.
        custom_functions: also draw custom ``torch.autograd.Function`` ops (:class:`HonestMul`,
            :class:`HonestMatmul`), whose backward computes only what ``ctx.needs_input_grad`` asks for,
            :class:`StopsSecond`, whose backward returns None for its second argument, and
            :class:`Double`, with and without ``ctx.set_materialize_grads(False)``: ``StopsSecond(x,
            Double(p))`` gives ``p`` a zero gradient in a full backward (Double's backward runs on
            materialized zeros), and None where Double does not materialize.

    Every value has shape ``(3, 4)``, ``(4, 4)``, ``(4,)``, ``(3, 1)``, ``(1,)`` or ``()``; ops only combine
    values whose shapes fit. At least one output requires grad.
    """
    choose = _Choices(source)
    num_inputs = choose.integer(1, 3)
    input_requires_grad = [choose.integer(0, 3) > 0 for _ in range(num_inputs)]
    shapes: list[tuple[int, ...]] = [(BATCH, WIDTH)] * num_inputs
    requires_grad = list(input_requires_grad)
    depends_on_param = [False] * num_inputs
    depends_on_input = [True] * num_inputs

    param_shapes: list[tuple[int, ...]] = []
    param_names: list[list[str]] = []
    for index in range(choose.integer(1, 4)):
        shape = choose.pick([(WIDTH, WIDTH), (WIDTH, WIDTH), (WIDTH,), ()])
        names = [f"p{index}"]
        if choose.integer(0, 4) == 0:
            names.append(f"tied.p{index}")  # the same Parameter under a second name
        param_shapes.append(shape)
        param_names.append(names)
        shapes.append(shape)
        requires_grad.append(True)
        depends_on_param.append(True)
        depends_on_input.append(False)

    plan = RandomModelPlan(input_requires_grad, param_shapes, param_names)
    matrices = lambda: [index for index, shape in enumerate(shapes) if shape == (WIDTH, WIDTH)]
    rows = lambda: [index for index, shape in enumerate(shapes) if shape and shape[-1] == WIDTH]

    def any_value() -> int:
        """One of the three newest values (deep chains), an input, or any value, a third of the time each."""
        where = choose.integer(0, 2)
        if where == 0:
            return choose.integer(max(0, len(shapes) - 3), len(shapes) - 1)
        if where == 1:
            return choose.integer(0, num_inputs - 1)
        return choose.integer(0, len(shapes) - 1)

    kinds = (*OP_KINDS, "custom", "custom") if custom_functions else OP_KINDS
    for _ in range(choose.integer(2, max_ops)):
        kind = choose.pick(kinds)
        variant = ""
        if kind == "custom":
            kind, variant = choose.pick(CUSTOM_OPS)
        if kind in ("matmul", "linear"):
            if not matrices():
                kind = "unary"
            else:
                left = any_value()
                if left not in rows():
                    left = choose.pick(rows())
                weight = choose.pick(matrices())
                operands: tuple[int, ...] = (left, weight)
                if kind == "linear":
                    vectors = [index for index, shape in enumerate(shapes) if shape == (WIDTH,)]
                    if vectors and choose.boolean():
                        operands = (left, weight, choose.pick(vectors))
                shape = shapes[left]
        if kind == "binary":
            first = any_value()
            second = any_value()
            weight_side = [index for index, only in enumerate(depends_on_input) if not only]
            if variant == "custom_stops_second" and choose.boolean():
                # the newest value computed from parameters alone (a Double of one, often): weight side
                second = weight_side[-1]
            try:
                shape = tuple(torch.broadcast_shapes(shapes[first], shapes[second]))
                operands = (first, second)
                variant = variant or choose.pick(BINARY_OPS)
            except RuntimeError:
                kind = "unary"
        if kind == "in_place":
            first = any_value()
            fitting = [index for index, other in enumerate(shapes) if _broadcasts_into(other, shapes[first])]
            operands = (first, choose.pick(fitting))
            variant = choose.pick(("add_", "mul_"))
            shape = shapes[first]
        if kind in ("chunk", "transpose"):
            candidates = rows() if kind == "chunk" else [i for i, s in enumerate(shapes) if len(s) == 2]
            if not candidates:
                kind = "unary"
            else:
                operands = (choose.pick(candidates),)
                shape = shapes[operands[0]]
                if kind == "transpose":
                    shape = (shape[1], shape[0])
        if kind == "reduce":
            operands = (any_value(),)
            variant = choose.pick(REDUCTION_OPS)
            shape = _reduced_shape(variant, shapes[operands[0]])
        if kind == "detach":
            operands = (any_value(),)
            shape = shapes[operands[0]]
        if kind == "unary":
            operands = (any_value(),)
            if variant in CUSTOM_UNARY_OPS and choose.boolean():
                operands = (choose.integer(num_inputs, num_inputs + len(param_shapes) - 1),)  # a parameter
            variant = variant if variant in CUSTOM_UNARY_OPS else choose.pick(UNARY_OPS)
            shape = shapes[operands[0]]
        plan.ops.append(RandomOp(kind, variant, operands))
        shapes.append(shape)
        if kind == "detach":
            requires_grad.append(False)
            depends_on_param.append(False)
            depends_on_input.append(False)
        else:
            requires_grad.append(any(requires_grad[index] for index in operands))
            depends_on_param.append(any(depends_on_param[index] for index in operands))
            depends_on_input.append(any(depends_on_input[index] for index in operands))

    if custom_functions and choose.boolean():
        _append_missing_gradient(plan, choose, shapes, requires_grad, depends_on_input)

    first_op_value = num_inputs + len(param_shapes)
    consumed = {index for op in plan.ops for index in op.operands}
    sinks = [index for index in range(first_op_value, len(shapes)) if index not in consumed]
    outputs = set(sinks[-choose.integer(1, 3) :])  # the newest values nothing else uses
    if choose.boolean():
        outputs.add(choose.integer(num_inputs, len(shapes) - 1))  # parameters may be outputs too
    if not any(requires_grad[index] for index in outputs):
        outputs.add(next(index for index in reversed(range(len(shapes))) if requires_grad[index]))
    plan.outputs = sorted(outputs)
    order = list(range(len(param_shapes)))
    for position in range(len(order) - 1, 0, -1):
        swap = choose.integer(0, position)
        order[position], order[swap] = order[swap], order[position]
    plan.registration_order = order
    return plan


def _append_missing_gradient(
    plan: RandomModelPlan,
    choose: _Choices,
    shapes: list[tuple[int, ...]],
    requires_grad: list[bool],
    depends_on_input: list[bool],
) -> None:
    """End ``plan`` with ``StopsSecond(value, Double(parameter))``, sometimes with an op on the input path
    between the two (``StopsSecond(value, other * Double(parameter))``): the parameter's Nodes receive only
    missing gradients, and a full backward still runs them (zeros, or None without materializing)."""
    on_input_path = [
        index for index, needed in enumerate(requires_grad) if needed and depends_on_input[index]
    ]
    if not on_input_path:
        return
    first = choose.pick(on_input_path)
    parameters = [
        plan.num_inputs + index
        for index, shape in enumerate(plan.param_shapes)
        if _broadcasts_into(shape, shapes[first])
    ]
    if not parameters:
        return
    parameter = choose.pick(parameters)
    plan.ops.append(RandomOp("unary", choose.pick(CUSTOM_UNARY_OPS), (parameter,)))
    shapes.append(shapes[parameter])
    second = len(shapes) - 1
    if choose.boolean():  # an input-path op that itself receives no gradient at all
        plan.ops.append(RandomOp("binary", "mul", (first, second)))
        shapes.append(shapes[first])
        second = len(shapes) - 1
    plan.ops.append(RandomOp("binary", "custom_stops_second", (first, second)))
    shapes.append(shapes[first])
    for _ in range(len(shapes) - len(requires_grad)):
        requires_grad.append(True)
        depends_on_input.append(True)


def _broadcasts_into(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return tuple(torch.broadcast_shapes(shape, target)) == tuple(target)
    except RuntimeError:
        return False


def _reduced_shape(variant: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if variant == "norm" or not shape:
        return ()
    if variant == "sum_last":
        return (*shape[:-1], 1)
    return shape[1:]  # mean_first


class RandomModel(nn.Module):
    """A module that runs a :class:`RandomModelPlan`; inputs are keyword arguments ``x0``, ``x1`` ...

    Parameters are registered in ``plan.registration_order`` (or ``registration_order`` when given); a
    tied parameter is registered a second time in the child module ``tied``.
    """

    def __init__(self, plan: RandomModelPlan, registration_order: Sequence[int] | None = None) -> None:
        super().__init__()
        self.plan = plan
        order = plan.registration_order if registration_order is None else list(registration_order)
        values = [nn.Parameter(torch.randn(shape) / 2) for shape in plan.param_shapes]
        self.tied = nn.Module()
        for index in order:
            for name in plan.param_names[index]:
                owner = self.tied if name.startswith("tied.") else self
                owner.register_parameter(name.removeprefix("tied."), values[index])
        self._param_attributes = [f"p{index}" for index in range(len(values))]

    def forward(self, **inputs: Tensor) -> tuple[Tensor, ...]:
        plan = self.plan
        values: list[Tensor] = [inputs[f"x{index}"] for index in range(plan.num_inputs)]
        values.extend(getattr(self, name) for name in self._param_attributes)
        for op in plan.ops:
            values.append(_apply(op, [values[index] for index in op.operands]))
        return tuple(values[index] for index in plan.outputs)


def _summed_to(grad: Tensor, shape: torch.Size) -> Tensor:
    """``grad`` summed over the dimensions broadcasting added to ``shape``."""
    return grad.sum_to_size(shape) if len(shape) else grad.sum()


class HonestMul(torch.autograd.Function):
    """``first * second`` (broadcast), computing only the gradients ``ctx.needs_input_grad`` asks for."""

    @staticmethod
    def forward(ctx: Any, first: Tensor, second: Tensor) -> Tensor:
        ctx.save_for_backward(first, second)
        return first * second

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        first, second = ctx.saved_tensors
        grad_first = _summed_to(grad * second, first.shape) if ctx.needs_input_grad[0] else None
        grad_second = _summed_to(grad * first, second.shape) if ctx.needs_input_grad[1] else None
        return grad_first, grad_second


class HonestMatmul(torch.autograd.Function):
    """``rows @ matrix`` (rows of width 4, a ``(4, 4)`` matrix), computing only what is asked for."""

    @staticmethod
    def forward(ctx: Any, rows: Tensor, matrix: Tensor) -> Tensor:
        ctx.save_for_backward(rows, matrix)
        return rows @ matrix

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        rows, matrix = ctx.saved_tensors
        grad_rows = grad @ matrix.t() if ctx.needs_input_grad[0] else None
        width = matrix.shape[0]
        grad_matrix = (
            rows.reshape(-1, width).t() @ grad.reshape(-1, matrix.shape[1])
            if ctx.needs_input_grad[1]
            else None
        )
        return grad_rows, grad_matrix


class StopsSecond(torch.autograd.Function):
    """``first * second`` (broadcast) whose backward gives ``second`` no gradient (None), like a
    straight-through estimator: the Nodes before ``second`` still run in a full backward, on a missing
    gradient."""

    @staticmethod
    def forward(ctx: Any, first: Tensor, second: Tensor) -> Tensor:
        ctx.save_for_backward(first, second)
        return first * second

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None]:
        first, second = ctx.saved_tensors
        return (_summed_to(grad * second, first.shape) if ctx.needs_input_grad[0] else None), None


class Double(torch.autograd.Function):
    """``2 * value``; with ``materialize=False`` its backward receives a missing gradient as None
    (``ctx.set_materialize_grads(False)``) and passes None on, else as zeros, and passes zeros on."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, materialize: bool) -> Tensor:
        ctx.set_materialize_grads(materialize)
        return value * 2

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None) -> tuple[Tensor | None, None]:
        return (None if grad is None else grad * 2), None


def _apply(op: RandomOp, operands: list[Tensor]) -> Tensor:
    kind, variant = op.kind, op.variant
    if variant == "custom":
        return (HonestMatmul if kind == "matmul" else HonestMul).apply(*operands)
    if variant == "custom_stops_second":
        return StopsSecond.apply(*operands)
    if variant in CUSTOM_UNARY_OPS:
        return Double.apply(operands[0], variant == "custom_double")
    if kind == "matmul":
        return operands[0] @ operands[1]
    if kind == "linear":
        return functional.linear(operands[0], operands[1], operands[2] if len(operands) > 2 else None)
    if kind == "binary":
        first, second = operands
        return {"add": torch.add, "mul": torch.mul, "sub": torch.sub}[variant](first, second)
    if kind == "in_place":
        result = operands[0].clone()
        return result.add_(operands[1]) if variant == "add_" else result.mul_(operands[1])
    if kind == "chunk":
        first, second = operands[0].chunk(2, dim=-1)
        return torch.cat([second * first, first], dim=-1)
    if kind == "transpose":
        return operands[0].transpose(0, 1)
    if kind == "reduce":
        value = operands[0]
        if variant == "norm":
            return value.norm()
        if value.dim() == 0:
            return value * 1.0
        if variant == "sum_last":
            return value.sum(dim=-1, keepdim=True)
        return value.mean(dim=0)
    if kind == "detach":
        return operands[0].detach()
    value = operands[0]
    if variant == "tanh":
        return torch.tanh(value)
    if variant == "sigmoid":
        return torch.sigmoid(value)
    if variant == "square":
        return value * value
    if variant == "relu":
        return torch.relu(value)
    return torch.exp(-value.abs())


def random_model(
    source: Any,
    *,
    max_ops: int = 12,
    registration_order: Sequence[int] | None = None,
    custom_functions: bool = False,
) -> ModelAndInputs:
    """A random small model and its inputs.

    Args:
        source: a ``random.Random``, an int seed, or a hypothesis ``data`` object (``st.data()``).
        max_ops: most ops in the DAG (linear, elementwise, reduction, chunk, transpose, detach, in-place).
        registration_order: parameter registration order (default: drawn from ``source``).
        custom_functions: also draw custom Functions that honour ``ctx.needs_input_grad``.

    Returns:
        ``(module, inputs)``: a :class:`RandomModel` with 1-4 parameters (some used several times, some
        tied under two names) and ``inputs`` ``{"x0": ..., ...}``, float32 ``(3, 4)``, some requiring grad.
        The module returns a tuple of 1-3 tensors; some may depend on parameters only, and at least one
        requires grad. ``module.plan`` rebuilds the same model with :class:`RandomModel`.
    """
    plan = plan_random_model(source, max_ops=max_ops, custom_functions=custom_functions)

    def make() -> ModelAndInputs:
        module = RandomModel(plan, registration_order)
        inputs = {
            f"x{index}": torch.randn(BATCH, WIDTH).requires_grad_(needs_grad)
            for index, needs_grad in enumerate(plan.input_requires_grad)
        }
        return module, inputs

    return _seeded(make)


# --------------------------------------------------------------------------------------------------------
# Brute-force reference for parameter groups


@dataclass(slots=True, frozen=True)
class ReferenceGroup:
    """A parameter group computed by :func:`reference_param_groups`.

    ``params``: every name of every parameter in the group; ``entries``: the autograd Nodes where the
    group's gradients leave the input path (intermediates) or enter from a parameter-only stage output;
    ``shared``: names of parameters that reach two or more entries.
    """

    params: frozenset[str]
    intermediates: frozenset[Node]
    output_entries: frozenset[Node]
    shared: frozenset[str]


def reference_param_groups(
    outputs: Iterable[Tensor], inputs: Iterable[Tensor], module: nn.Module
) -> tuple[list[ReferenceGroup], set[str]]:
    """Parameter groups by brute force: one closure walk per parameter, then a union-find.

    Works on the autograd Nodes directly (``next_functions``), not on a captured graph. Stage inputs are
    the ``inputs`` that require grad; the walk stops at them. Returns the groups sorted by parameter
    names and the names of the parameters that require grad and reach no output.
    """
    output_edges = [get_gradient_edge(tensor) for tensor in outputs if tensor.requires_grad]
    input_nodes = {get_gradient_edge(tensor).node for tensor in inputs if tensor.requires_grad}

    # Every node reachable from the outputs, and who consumes whom (the forward direction).
    consumers: dict[Node, list[Node]] = {}
    stack = [edge.node for edge in output_edges]
    seen = set(stack)
    while stack:
        node = stack.pop()
        consumers.setdefault(node, [])
        if node in input_nodes:
            continue
        for producer, _ in node.next_functions:
            if producer is None:
                continue
            consumers.setdefault(producer, []).append(node)
            if producer not in seen:
                seen.add(producer)
                stack.append(producer)

    def depends_on(source: Node) -> set[Node]:
        found = {source}
        pending = [source]
        while pending:
            for consumer in consumers[pending.pop()]:
                if consumer not in found:
                    found.add(consumer)
                    pending.append(consumer)
        return found

    names_of: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(parameter), []).append(name)
    leaves = [node for node in seen if type(node).__name__ == "AccumulateGrad" and node not in input_nodes]
    in_input_closure: set[Node] = set()
    for node in input_nodes & seen:
        in_input_closure |= depends_on(node)
    closure_of = {leaf: depends_on(leaf) for leaf in leaves}
    weight_only = set().union(*closure_of.values()) - in_input_closure if closure_of else set()
    output_nodes = {edge.node for edge in output_edges}

    def is_intermediate(node: Node) -> bool:
        return node in in_input_closure and any(
            producer in weight_only for producer, _ in node.next_functions if producer is not None
        )

    entries_of: dict[Node, set[Node]] = {}
    for leaf in leaves:
        entries: set[Node] = set()
        pending = [leaf]
        visited = {leaf}
        while pending:
            node = pending.pop()
            if node in output_nodes:
                entries.add(node)
            for consumer in consumers[node]:
                if consumer in weight_only and consumer not in visited:
                    visited.add(consumer)
                    pending.append(consumer)
                elif is_intermediate(consumer):
                    entries.add(consumer)
        entries_of[leaf] = entries

    parent = {leaf: leaf for leaf in leaves}

    def find(leaf: Node) -> Node:
        while parent[leaf] is not leaf:
            leaf = parent[leaf]
        return leaf

    for first in leaves:
        for second in leaves:
            if entries_of[first] & entries_of[second]:
                parent[find(first)] = find(second)

    def leaf_names(leaf: Node) -> list[str]:
        return names_of.get(id(leaf.variable), [f"<leaf {tuple(leaf.variable.shape)}>"])

    components: dict[Node, list[Node]] = {}
    for leaf in leaves:
        components.setdefault(find(leaf), []).append(leaf)
    groups = []
    for members in components.values():
        entries = set().union(*(entries_of[leaf] for leaf in members))
        groups.append(
            ReferenceGroup(
                params=frozenset(name for leaf in members for name in leaf_names(leaf)),
                intermediates=frozenset(node for node in entries if node in in_input_closure),
                output_entries=frozenset(node for node in entries if node not in in_input_closure),
                shared=frozenset(
                    name for leaf in members if len(entries_of[leaf]) >= 2 for name in leaf_names(leaf)
                ),
            )
        )
    groups.sort(key=lambda group: sorted(group.params))
    reached = {id(leaf.variable) for leaf in leaves}
    unused = {
        name
        for name, parameter in module.named_parameters(remove_duplicate=False)
        if parameter.requires_grad and id(parameter) not in reached
    }
    return groups, unused


def parameters_with_gradient(module: nn.Module, outputs: Any) -> set[str]:
    """Names of the parameters that a full backward from every output (all-ones gradients) reaches."""
    tensors = output_tensors(outputs)
    named = list(module.named_parameters(remove_duplicate=False))
    unique = list({id(parameter): parameter for _, parameter in named if parameter.requires_grad}.values())
    if not unique:
        return set()
    gradients = torch.autograd.grad(
        tensors,
        unique,
        grad_outputs=[torch.ones_like(tensor) for tensor in tensors],
        allow_unused=True,
        retain_graph=True,
    )
    received = {
        id(parameter) for parameter, gradient in zip(unique, gradients, strict=True) if gradient is not None
    }
    return {name for name, parameter in named if id(parameter) in received}


def partition(groups: Iterable[ParamGroup]) -> set[frozenset[str]]:
    """The parameter names of each group, as a set of sets (order-free)."""
    return {frozenset(group.params) for group in groups}


def check_param_groups(module: nn.Module, inputs: dict[str, Any], outputs: Any) -> ParamGroups:
    """Assert that :func:`graphkit.param_groups` agrees with both oracles; return its groups.

    - full backward: every parameter that receives a gradient is in exactly one group, no other
      parameter is, and ``unused_params`` are exactly the parameters that require grad and get none;
    - :func:`reference_param_groups`: the same groups, intermediates (as autograd Nodes), parameter-only
      output entries and shared parameters; the ``shared-parameter`` and ``parameter-only-output``
      flags are set exactly when those are non-empty.
    """
    graph = capture(outputs, inputs=inputs, module=module)
    groups = param_groups(graph)

    grouped = [name for group in groups for name in group.params]
    assert len(grouped) == len(set(grouped)), f"a parameter is in two groups: {grouped}"
    assert set(grouped) == parameters_with_gradient(module, outputs)
    every = {
        name for name, parameter in module.named_parameters(remove_duplicate=False) if parameter.requires_grad
    }
    assert set(groups.unused_params) == every - set(grouped)

    tensors_in = [value for value in inputs.values() if isinstance(value, Tensor)]
    reference, unused = reference_param_groups(output_tensors(outputs), tensors_in, module)
    assert set(groups.unused_params) == unused
    got = [
        (
            frozenset(group.params),
            frozenset(graph.autograd_nodes[node] for node in group.intermediates),
            frozenset(graph.autograd_nodes[entry.node] for entry in group.output_entries),
            frozenset(group.shared_params),
        )
        for group in groups
    ]
    expected = [(ref.params, ref.intermediates, ref.output_entries, ref.shared) for ref in reference]
    assert sorted(got, key=lambda row: sorted(row[0])) == expected
    # Forward order: a group with intermediates precedes another when the forward created its first
    # intermediate earlier (autograd sequence numbers count Node creation); those without follow.
    firsts = [min((node._sequence_nr() for node in row[1]), default=None) for row in got]
    with_intermediates = [first for first in firsts if first is not None]
    assert with_intermediates == sorted(with_intermediates)
    assert firsts[: len(with_intermediates)] == with_intermediates
    for group in groups:
        assert (GroupFlag.SHARED_PARAMETER in group.flags) == bool(group.shared_params)
        assert (GroupFlag.PARAMETER_ONLY_OUTPUT in group.flags) == bool(group.output_entries)
    return groups
