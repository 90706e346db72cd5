"""``torch.compile(block, backend=graphkit.splitting_backend())``: compiled regions whose backward splits.

A region compiled the usual way reaches the autograd graph as one ``CompiledFunctionBackward`` Node that
computes every gradient at once, so graphkit's split runs it once, in I, weight gradients included
(:mod:`graphkit.split.run_once`). This backend compiles each graph dynamo captures (each one on its own
when the code has graph breaks) with AOTAutograd as usual, then cuts its backward graph into an I graph and
a W graph (:func:`graphkit.split.compiled_partition.partition_backward`), compiles the forward, the whole
backward and both parts with the inner compiler, and runs them in a :class:`SplitRegionFunction`: a custom
Function whose backward computes what ``ctx.needs_input_grad`` asks for. graphkit's split sets that per
phase, so the region's weight-gradient work moves to W; a plain ``loss.backward()`` runs the whole compiled
backward, as before.

Which inputs are *weights* is decided at compile time: the inputs that are ``nn.Parameter`` (dynamo lifts a
module's parameters into graph inputs, or the graph holds them as attributes; both count). Any other input
gradient is computed in I.

A region the backend cannot split runs as AOTAutograd compiled it (its whole backward once, in I) and a
``UserWarning`` names why: an input mutated in place, an output aliasing an input, a backward that mutates,
has side effects or draws random numbers, dynamic shapes (SymInt arguments), hooks registered inside the
region (a BackwardState argument), functionalized RNG, tensor subclasses.

Dropout is exact: the forward draws its random mask once and saves it (neither partitioner recomputes a
random op), and both backward parts read the saved mask. Under activation checkpointing inside the region
the backward recomputes dropout from the RNG state the forward saved (``run_with_rng_state``), the same
mask again, in whichever part needs it.

Regions whose backward calls higher-order ops split as well (``flex_attention_backward`` with its
``score_mod`` and ``mask_mod`` subgraphs, ``invoke_subgraph`` of nested compile regions):
:mod:`graphkit.split.compiled_partition` says how.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from graphkit.split import _aot_autograd
from graphkit.split.compiled_partition import UnsplittableBackward, partition_backward
from graphkit.split.compiled_region import SplitRegion

__all__ = [
    "INNER_COMPILERS",
    "REGISTERED_NAMES",
    "compile_split_region",
    "graphkit_split",
    "graphkit_split_eager",
    "register_backends",
    "splitting_backend",
]

INNER_COMPILERS = ("inductor", "aot_eager")
"""The compilers of the graphs: inductor (fused kernels) or ``"aot_eager"`` (the aten graphs run as traced)."""

REGISTERED_NAMES = {"graphkit_split": "inductor", "graphkit_split_eager": "aot_eager"}
"""The names under which :func:`register_backends` makes the backend selectable by string
(``torch.compile(block, backend="graphkit_split")``), with their inner compilers."""


def splitting_backend(inner: str = "inductor") -> Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]:
    """A ``torch.compile`` backend whose regions split their backward into I and W (module docstring).

    Args:
        inner: the compiler of the forward, the backward and its two parts: ``"inductor"`` (default) or
            ``"aot_eager"`` (no code generation; I then W is bit for bit the region's whole backward).

    Returns:
        The backend, for ``torch.compile(module, backend=...)``.

    Raises:
        ValueError: ``inner`` is none of :data:`INNER_COMPILERS`.
    """
    if inner not in INNER_COMPILERS:
        raise ValueError(f"inner={inner!r}: the splitting backend compiles with one of {INNER_COMPILERS}")

    def backend(module: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        return compile_split_region(module, example_inputs, inner=inner)

    backend.__name__ = f"graphkit_splitting_backend_{inner}"
    return backend


graphkit_split = splitting_backend("inductor")
"""The backend with inductor: what ``torch.compile(backend="graphkit_split")`` selects."""

graphkit_split_eager = splitting_backend("aot_eager")
"""The backend with ``"aot_eager"``: what ``torch.compile(backend="graphkit_split_eager")`` selects."""


def register_backends() -> None:
    """Register the backend under :data:`REGISTERED_NAMES` (each once), so that a configuration string
    selects it as ``torch.compile(backend="graphkit_split")`` or torchtitan's ``compile.backend`` do.

    An installed graphkit declares both names as ``torch_dynamo_backends`` entry points, which dynamo
    finds by itself; this registers them for a graphkit run from a source tree. ``graphkit.pipelining``
    and :func:`graphkit.measure.costs.spec_costs` call it, for the ``compile=`` key of pipeline specs.
    """
    from torch._dynamo import list_backends, register_backend

    known = set(list_backends(exclude_tags=()))
    backends = {"graphkit_split": graphkit_split, "graphkit_split_eager": graphkit_split_eager}
    for name in REGISTERED_NAMES:
        if name not in known:
            register_backend(backends[name], name=name)


def _compiler(inner: str, *, backward: bool) -> Callable[[fx.GraphModule, Sequence[Any]], Any]:
    if inner == "inductor":
        return lambda module, example_inputs: _aot_autograd.compile_with_inductor(
            module, example_inputs, backward=backward
        )
    return lambda module, example_inputs: _aot_autograd.boxed(module)


class _RegionCompiler:
    """AOTAutograd's compilers for one captured graph: notes the backward graph when the partitioner makes
    it, and, when the forward is compiled, cuts and compiles the backward (or notes why not)."""

    def __init__(self, inner: str, full_arguments: Sequence[Any]) -> None:
        self.inner = inner
        self.full_arguments = full_arguments
        self.partitioner = _aot_autograd.partitioner(inner)
        self.backward_graph: fx.GraphModule | None = None
        self.region_parts: dict[str, Any] | None = None
        self.refusal: str | None = None

    def partition(self, joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        forward_graph, backward_graph = self.partitioner(joint, joint_inputs, **kwargs)
        self.backward_graph = backward_graph
        return forward_graph, backward_graph

    def compile_forward(self, module: fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiled = _compiler(self.inner, backward=False)(module, example_inputs)
        if self.backward_graph is not None:  # an inference graph has none
            try:
                self.region_parts = self._split(module, _aot_autograd.forward_metadata())
            except UnsplittableBackward as refusal:
                self.refusal = str(refusal)
            else:
                self.region_parts["forward"] = compiled
        return compiled

    def compile_backward(self, module: fx.GraphModule, example_inputs: list[Any]) -> Any:
        return _compiler(self.inner, backward=True)(module, example_inputs)

    def _split(self, forward: fx.GraphModule, metadata: Any) -> dict[str, Any]:
        refusal = _aot_autograd.region_refusal(metadata)
        if refusal is not None:
            raise UnsplittableBackward(refusal)
        backward = self.backward_graph
        assert backward is not None
        forward_inputs = [node for node in forward.graph.nodes if node.op == "placeholder"]
        if len(forward_inputs) != len(self.full_arguments):
            raise UnsplittableBackward("AOTAutograd merged inputs that are the same tensor")
        forward_outputs = next(node for node in forward.graph.nodes if node.op == "output").args[0]
        output_count = len(metadata.output_info)
        if metadata.num_forward_returns != output_count:
            raise UnsplittableBackward("the forward returns more than the region's outputs")
        placeholders = [node for node in backward.graph.nodes if node.op == "placeholder"]
        values = [node.meta.get("val") for node in placeholders]
        if not all(isinstance(value, torch.Tensor) for value in values):
            raise UnsplittableBackward(
                "the backward takes arguments that are no tensors (SymInts under dynamic shapes, or the "
                "BackwardState of hooks registered inside the region)"
            )
        saved_nodes = forward_outputs[output_count:]
        tangent_count = len(placeholders) - len(saved_nodes)
        if any(
            not isinstance(node, fx.Node)
            or (node.name != placeholder.name and not _aot_autograd.saved_rng_state(node, placeholder))
            for node, placeholder in zip(saved_nodes, placeholders, strict=False)
        ) or not all(node.name.startswith("tangents") for node in placeholders[len(saved_nodes) :]):
            raise UnsplittableBackward(
                "the backward's arguments are not the saved tensors, then the tangents"
            )
        saved = tuple(node.name for node in saved_nodes)
        differentiable = tuple(bool(info.requires_grad) for info in metadata.output_info)
        tangent_outputs = tuple(position for position, needed in enumerate(differentiable) if needed)
        if len(tangent_outputs) != tangent_count:
            raise UnsplittableBackward(
                f"the backward takes {tangent_count} gradients for {len(tangent_outputs)} outputs requiring grad"
            )
        weights = [
            position
            for position, argument in enumerate(self.full_arguments)
            if isinstance(argument, torch.nn.Parameter) and argument.requires_grad
        ]
        partition = partition_backward(backward, weights)
        boundary_values = [
            node.meta.get("val") for node in partition.weight_graph.graph.nodes if node.op == "placeholder"
        ]
        compile_backward = _compiler(self.inner, backward=True)
        try:
            compiled = {
                "backward": compile_backward(backward, values),
                "input_backward": compile_backward(partition.input_graph, values),
                "weight_backward": compile_backward(partition.weight_graph, boundary_values),
            }
        except Exception as error:  # the inner compiler refuses a part: say so, run the region unsplit
            raise UnsplittableBackward(
                f"{self.inner} did not compile a part: {type(error).__name__}: {error}"
            ) from error
        return {
            **compiled,
            "partition": partition,
            "output_count": output_count,
            "saved": saved,
            "differentiable_outputs": differentiable,
            "tangent_outputs": tangent_outputs,
            "tangent_layouts": tuple(
                (tuple(value.shape), tuple(value.stride())) for value in values[len(saved_nodes) :]
            ),
        }


def compile_split_region(
    module: fx.GraphModule, example_inputs: list[Any], *, inner: str
) -> Callable[..., Any]:
    """Compile one captured graph with its backward split (module docstring): what the backend does.

    Returns a :class:`SplitRegion`, or, for a region it cannot split (a warning says why) or an inference
    graph, what AOTAutograd compiled.
    """
    attributes = {
        **dict(module.named_parameters(remove_duplicate=False)),
        **dict(module.named_buffers(remove_duplicate=False)),
    }
    parameters = tuple(attributes.values())  # before the inputs, in AOTAutograd's order
    region_compiler = _RegionCompiler(inner, [*parameters, *example_inputs])
    compiled = _aot_autograd.aot_compile(
        module,
        example_inputs,
        fw_compiler=region_compiler.compile_forward,
        bw_compiler=region_compiler.compile_backward,
        partition_fn=region_compiler.partition,
        decompositions=_aot_autograd.inductor_decompositions() if inner == "inductor" else None,
        inductor=inner == "inductor",
    )
    if region_compiler.refusal is not None:
        warnings.warn(
            f"graphkit.splitting_backend: {region_compiler.refusal}; this compiled region runs its whole "
            "backward once, in I (weight gradients included), as without the splitting backend",
            stacklevel=2,
        )
    parts = region_compiler.region_parts
    if parts is None:
        return compiled
    return SplitRegion(parameters=parameters, disable_autocast=_aot_autograd.autocast_enabled(), **parts)
