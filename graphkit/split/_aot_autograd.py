"""Small, isolated accessors for the parts of ``torch.compile`` that :mod:`graphkit.split.compile_backend`
needs and that have no public API.

Everything private that the splitting backend touches lives here, so that a change in PyTorch breaks one
small file (and the keyed tests that pin it, ``tests/test_splitting_backend.py``):

- ``torch._functorch.aot_autograd.aot_module_simplified``: AOTAutograd's entry for a dynamo graph, the one
  ``torch._dynamo.backends.common.aot_autograd`` wraps; it traces the joint forward-backward graph and
  calls ``partition_fn``, then ``fw_compiler`` (the backward compiler lazily, at the first backward);
- ``torch._functorch.partitioners.default_partition`` (what ``"aot_eager"`` uses) and
  ``torch._inductor.compile_fx.partition_fn`` (what inductor uses);
- ``torch._guards.TracingContext.fw_metadata``: AOTAutograd's ``ViewAndMutationMeta`` of the region (which
  inputs it mutates, which outputs alias what), readable while ``fw_compiler`` runs;
- the *boxed* calling convention of AOTAutograd's compilers: a compiled graph takes one list of
  arguments and says so with a ``_boxed_call`` attribute (``torch/_functorch/_aot_autograd/utils.py``);
- ``torch._C._autograd._get_current_graph_task_keep_graph``: whether the running backward keeps the graph
  (``retain_graph=True``), as AOTAutograd's own backward asks it;
- ``torch._C._is_any_autocast_enabled`` and ``torch._C._DisableAutocast``: the compiled graphs ran their
  autocast casts at trace time, so AOTAutograd runs them with autocast off (``disable_amp``);
- ``torch._inductor.virtualized.V.set_fake_mode``: the fake mode inductor's passes read;
- ``TracingContext.output_strides``: where inductor reports a compiled graph's output strides, and
  ``fw_metadata.bw_donated_idxs``: the saved tensors inductor may overwrite in a backward (none, here);
- ``Tensor._version``: the version counter, to check saved tensors against in-place changes;
- ``torch._inductor.compile_fx.compile_fx_inner`` and ``torch._inductor.decomposition.select_decomp_table``:
  inductor's compiler of one aten graph, and the decompositions its graphs are traced with;
- how ``torch._functorch.partitioners`` hands a recomputed random op (dropout under activation
  checkpointing) its saved RNG state on the CPU: the forward returns ``getitem(run_and_save_rng_state(...),
  0)`` among its saved values, the backward takes it as a placeholder named ``rng_state_output_<n>`` in the
  same position and replays the op with ``run_with_rng_state``.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

__all__ = [
    "aot_compile",
    "autocast_enabled",
    "boxed",
    "call_boxed",
    "compile_with_inductor",
    "forward_metadata",
    "inductor_decompositions",
    "keeps_graph",
    "no_autocast",
    "partitioner",
    "region_refusal",
    "saved_rng_state",
    "version",
]


def aot_compile(
    module: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fw_compiler: Callable[[fx.GraphModule, list[Any]], Any],
    bw_compiler: Callable[[fx.GraphModule, list[Any]], Any],
    partition_fn: Callable[..., tuple[fx.GraphModule, fx.GraphModule]],
    decompositions: dict[Any, Any] | None,
    inductor: bool,
) -> Callable[..., Any]:
    """AOTAutograd over a dynamo graph: the callable torch.compile runs (``aot_module_simplified``).

    Called outside dynamo (a graph from ``torch.fx.symbolic_trace``), it opens the tracing context dynamo
    would have opened, so that :func:`forward_metadata` can read the region's metadata. For inductor it
    also sets inductor's fake mode (``V.set_fake_mode``), as ``torch._inductor.compile_fx.compile_fx``
    does around the same call: inductor's joint-graph passes and compilers read it.
    """
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._subclasses.fake_tensor import FakeTensorMode

    with contextlib.ExitStack() as stack:
        context = torch._guards.TracingContext.try_get()
        if context is None:
            context = torch._guards.TracingContext(FakeTensorMode())
            stack.enter_context(torch._guards.tracing(context))
        if inductor:
            from torch._inductor.virtualized import V

            stack.enter_context(V.set_fake_mode(context.fake_mode))
        return aot_module_simplified(
            module,
            example_inputs,
            fw_compiler=fw_compiler,
            bw_compiler=bw_compiler,
            partition_fn=partition_fn,
            decompositions=decompositions,
        )


def partitioner(inner: str) -> Callable[..., tuple[fx.GraphModule, fx.GraphModule]]:
    """The joint-graph partitioner the ``inner`` compiler uses: the default one for ``"aot_eager"``;
    for inductor its own (``torch._inductor.compile_fx.partition_fn``: inductor's joint-graph passes, which
    turn random ops into seeded ``inductor_random`` draws, then the min-cut partitioner, which recomputes
    cheap ops in the backward instead of saving them, random ops never)."""
    if inner == "inductor":
        from torch._inductor.compile_fx import partition_fn

        return partition_fn
    from torch._functorch.partitioners import default_partition

    return default_partition


def inductor_decompositions() -> dict[Any, Any]:
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def forward_metadata() -> Any:
    """AOTAutograd's ``ViewAndMutationMeta`` of the region being compiled (inside ``fw_compiler``), or None."""
    context = torch._guards.TracingContext.try_get()
    return None if context is None else getattr(context, "fw_metadata", None)


def region_refusal(metadata: Any) -> str | None:
    """Why AOTAutograd's runtime wrapper does more than call the graphs for this region, or None.

    The splitting backend runs the compiled graphs itself; it takes only regions whose wrapper has nothing
    to add: no input mutated (data or metadata), no output aliasing an input or an intermediate, no
    functionalized RNG state, no effect tokens, no tensor subclasses.
    """
    if metadata is None:
        return "AOTAutograd's metadata of the region is not readable on this torch"
    from torch._functorch._aot_autograd.schemas import OutputType, SubclassCreationMeta

    for index, info in enumerate(metadata.input_info):
        if info.mutates_data or info.mutates_metadata:
            return f"the region mutates its input {index} in place"
    for index, info in enumerate(metadata.output_info):
        if info.output_type is not OutputType.non_alias:
            return f"the region's output {index} aliases an input or another output ({info.output_type.name})"
    if metadata.num_intermediate_bases:
        return "the region returns views of its intermediates"
    if metadata.is_rng_op_functionalized:
        return "the region's RNG ops are functionalized (torch._functorch.config.functionalize_rng_ops)"
    if metadata.tokens:
        return "the region runs ops with side effects (effect tokens)"
    for kind in ("inp", "fw_graph_out", "tangent"):
        if any(isinstance(meta, SubclassCreationMeta) for meta in getattr(metadata, f"subclass_{kind}_meta")):
            return "the region takes or returns tensor subclasses"
    return None


def saved_rng_state(saved: fx.Node, placeholder: fx.Node) -> bool:
    """Whether the forward's saved value ``saved`` is an RNG state that the backward takes as
    ``placeholder`` (module docstring): the partitioner renames it there."""
    producer = saved.args[0] if saved.target is operator.getitem and saved.args[1] == 0 else None
    return (
        placeholder.name.startswith("rng_state_output_")
        and isinstance(producer, fx.Node)
        and producer.target is torch.ops.higher_order.run_and_save_rng_state
    )


def boxed(module: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """``module`` in AOTAutograd's boxed convention: one list of arguments, marked ``_boxed_call``."""

    def run(arguments: list[Any]) -> Any:
        return module(*arguments)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def call_boxed(compiled: Callable[..., Any], arguments: list[Any]) -> Any:
    """Call a compiled graph in whichever convention it has (the list is consumed by boxed ones)."""
    if getattr(compiled, "_boxed_call", False):
        return compiled(arguments)
    return compiled(*arguments)


def compile_with_inductor(module: fx.GraphModule, example_inputs: Sequence[Any], *, backward: bool) -> Any:
    """Inductor's compiled form of one aten graph (boxed), as AOTAutograd's inductor compilers make it."""
    from torch._inductor.compile_fx import compile_fx_inner

    # inductor reports each graph's output strides to the tracing context, which holds the forward's for
    # AOTAutograd: a backward part reports into a list of its own. And it may reuse the memory of the saved
    # tensors AOTAutograd lists as donated (fw_metadata.bw_donated_idxs) for its outputs: W reads saved
    # tensors after I, and a retained graph reads them again, so no part may (as AOTAutograd clears the
    # list itself for a backward under retain_graph=True)
    context = torch._guards.TracingContext.try_get()
    kept = None if context is None else context.output_strides
    metadata = None if context is None else getattr(context, "fw_metadata", None)
    donated = None if metadata is None else metadata.bw_donated_idxs
    if kept is not None:
        context.output_strides = []
    if donated:
        metadata.bw_donated_idxs = []
    try:
        return compile_fx_inner(module, list(example_inputs), is_backward=backward)
    finally:
        if kept is not None:
            context.output_strides = kept
        if donated:
            metadata.bw_donated_idxs = donated


def version(tensor: torch.Tensor) -> int:
    """The version counter of ``tensor`` (shared with its views and ``detach()``), bumped by in-place ops."""
    return tensor._version


def keeps_graph() -> bool:
    """Whether the backward running now keeps the graph (``retain_graph=True``)."""
    return bool(torch._C._autograd._get_current_graph_task_keep_graph())


def autocast_enabled() -> bool:
    return bool(torch._C._is_any_autocast_enabled())


def no_autocast(disable: bool) -> contextlib.AbstractContextManager[Any]:
    """Autocast off while a compiled graph runs (its casts are in the graph), when ``disable``."""
    return torch._C._DisableAutocast() if disable else contextlib.nullcontext()
