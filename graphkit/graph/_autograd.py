"""Small, isolated accessors for the parts of PyTorch's autograd ``Node`` that have no public API.

Everything that touches a private attribute of ``torch.autograd.graph.Node`` lives here, so that a change
in PyTorch breaks one small file and nothing else - except the per-op weight-side formulas of
:mod:`graphkit.split.weight_rules`, which read the ``_saved_<name>`` attributes (and the output dtype in
``_input_metadata``) of the ops they know by name, and fall back to calling the Node when one is missing:

- ``_input_metadata``: shape, dtype and device of each gradient a node receives (one per forward output);
- ``_saved_<name>`` / ``saved_tensors``: the tensors a node saved for its backward;
- ``_raw_saved_<name>``: the packed form of a saved tensor (``SavedTensor.unpack_hook`` tells whether
  ``torch.autograd.graph.saved_tensors_hooks`` packed it);
- ``_sequence_nr()``: the per-thread creation counter the autograd engine assigns to nodes;
- ``RemovableHandle.hooks_dict_ref`` of a ``Node.register_hook`` handle: the Node's Python post-hooks;
- ``held_tensors`` of a custom Function's Node (its ctx), a graphkit convention: tensors it holds as
  attributes rather than through ``save_for_backward`` (a region of ``graphkit.splitting_backend``);
- ``_forward_cls`` of a custom Function's Node: the ``torch.autograd.Function`` subclass it belongs to;
- ``run_function`` of a reentrant checkpoint's Node (its ctx): the function whose parameters the nested
  backward reaches;
- ``torch.autograd.graph._engine_run_backward``: the engine call behind ``torch.autograd.backward`` and
  ``torch.autograd.grad``;
- ``torch._C.DisableTorchFunctionSubclass``: to find the AccumulateGrad Node of a Tensor-subclass leaf;
- ``torch._C._will_engine_execute_node``, the query a ``register_multi_grad_hook`` hook makes, and the code
  name of that hook's closure (``register_multi_grad_hook.<locals>...inner_hook``).

Public API (``get_gradient_edge``, ``GradientEdge``, ``register_prehook``, ``next_functions``) is used
everywhere else directly.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = [
    "ACCUMULATE_GRAD_CLASS",
    "FREED_GRAPH_REASON",
    "HOOKED_SAVED_TENSORS_REASON",
    "GradientMetadata",
    "SavedTensorInfo",
    "any_custom_function",
    "asked_by_multi_grad_hook",
    "engine_execution_query",
    "aten_operator_names",
    "forward_class",
    "forward_op_name",
    "gradient_edge",
    "gradient_metadata",
    "is_accumulate_grad",
    "is_custom_function",
    "mark_own_hook",
    "reentrant_checkpoint_parameters",
    "run_engine_backward",
    "run_engine_grad",
    "saved_tensors",
    "sequence_number",
    "post_hooks_beside",
    "replace_engine_execution_query",
    "storage_key",
    "uses_saved_tensor_hooks",
]

FREED_GRAPH_REASON = (
    "the saved tensors were freed: a backward already ran through this graph without retain_graph=True"
)

HOOKED_SAVED_TENSORS_REASON = (
    "the saved tensors were packed by torch.autograd.graph.saved_tensors_hooks (activation checkpointing, "
    "offloading): reading them would run the unpack hook - for checkpointing, a recomputation of the forward"
)

_BACKWARD_SUFFIX = re.compile(r"Backward\d*$")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


@dataclass(slots=True, frozen=True)
class GradientMetadata:
    """Shape, dtype and device of one gradient a Node receives (= one forward output of the op)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


@dataclass(slots=True, frozen=True)
class SavedTensorInfo:
    """One tensor saved for backward: its name on the Node, shape, dtype and size in bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int


ACCUMULATE_GRAD_CLASS: type = getattr(getattr(torch._C, "_functions", None), "AccumulateGrad", type(None))
"""The class of AccumulateGrad Nodes (``torch._C._functions.AccumulateGrad``), for a ``type(node) is`` test
in hot loops; ``NoneType`` (matching no Node) on a PyTorch that does not expose it."""


def is_accumulate_grad(node: Node) -> bool:
    """True for the AccumulateGrad node of a leaf tensor that requires grad."""
    if ACCUMULATE_GRAD_CLASS is not type(None):
        return type(node) is ACCUMULATE_GRAD_CLASS
    return type(node).__name__ == "AccumulateGrad"


def has_tensor_hooks(tensor: torch.Tensor) -> bool:
    """True when ``tensor.register_hook`` (or ``register_multi_grad_hook``) put a hook on ``tensor``.

    Reads the private ``Tensor._backward_hooks`` (the dict ``register_hook`` fills; None until then).
    Hooks registered from C++ do not show there.
    """
    return bool(tensor._backward_hooks)


def is_custom_function(node: Node) -> bool:
    """True for the backward Node of a Python ``torch.autograd.Function``."""
    return isinstance(node, BackwardCFunction)


def any_custom_function(nodes: Sequence[Node]) -> bool:
    """Whether any of ``nodes`` is a custom Function's Node (one class test per distinct Node class)."""
    return any(issubclass(node_class, BackwardCFunction) for node_class in set(map(type, nodes)))


def forward_class(node: Node) -> type | None:
    """The ``torch.autograd.Function`` subclass a custom Function's Node belongs to; None for other Nodes."""
    return getattr(node, "_forward_cls", None)


def reentrant_checkpoint_parameters(node: Node) -> list[torch.Tensor]:
    """Parameters a reentrant checkpoint (``checkpoint(..., use_reentrant=True)``) uses inside its region.

    They are no edge of the graph: the Node's nested backward reaches them. Found through the
    ``run_function`` it keeps (``CheckpointFunction.forward`` in ``torch/utils/checkpoint.py``): a
    module, a bound method of one, a ``functools.partial`` of these, or a function whose closure or
    arguments hold modules. Empty for any other Node, or a region that reaches its modules otherwise
    (globals).
    """
    function_class = forward_class(node)
    if function_class is None or function_class.__name__ != "CheckpointFunction":
        return []
    stack = [getattr(node, "run_function", None)]
    modules: dict[int, torch.nn.Module] = {}
    for _ in range(64):  # functions wrap functions a few levels deep at most
        if not stack:
            break
        function = stack.pop()
        if isinstance(function, torch.nn.Module):
            modules[id(function)] = function
            continue
        owner = getattr(function, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            modules[id(owner)] = owner
        if isinstance(function, functools.partial):
            stack.append(function.func)
            stack.extend(function.args)
        for cell in getattr(function, "__closure__", None) or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
    found: dict[int, torch.Tensor] = {}
    for module in modules.values():
        for parameter in module.parameters():
            found[id(parameter)] = parameter
    return list(found.values())


_op_names_by_class: dict[type, str] = {}
_aten_names_by_key: dict[str, str] | None = None


def _squashed(name: str) -> str:
    return name.replace("_", "").lower()


def _aten_names() -> dict[str, str]:
    """Every ATen operator name (leading underscores dropped), keyed by its lower-case letters and digits.

    ``"maxpool2dwithindices" -> "max_pool2d_with_indices"``. PyTorch names a backward Node after its op in
    ``tools/autograd/derivatives.yaml`` by dropping the underscores and capitalising each word
    (``max_pool2d_with_indices`` -> ``MaxPool2DWithIndicesBackward0``), which cannot be undone by splitting
    at capitals; the registered op names tell where the underscores were.
    """
    global _aten_names_by_key
    if _aten_names_by_key is None:
        names: dict[str, str] = {}
        for qualified in sorted(torch._C._dispatch_get_all_op_names()):
            namespace, _, name = qualified.partition("::")
            if namespace != "aten":
                continue
            name = name.partition(".")[0].lstrip("_")
            if name:
                names.setdefault(_squashed(name), name)
        _aten_names_by_key = names
    return _aten_names_by_key


def aten_operator_names() -> frozenset[str]:
    """Every ATen operator name, leading underscores dropped (``"max_pool2d_with_indices"``, ``"fft_r2c"``)."""
    return frozenset(_aten_names().values())


def forward_op_name(node: Node) -> str:
    """Name of the forward op a Node differentiates, spelled as PyTorch's op: ``AddmmBackward0`` -> ``addmm``.

    ``MaxPool2DWithIndicesBackward0`` -> ``max_pool2d_with_indices``, ``FftR2CBackward0`` -> ``fft_r2c``
    (the ATen name, leading underscores dropped). AccumulateGrad becomes ``accumulate_grad``; a custom
    Function keeps its class name (``MyFunction``); a Node that no ATen op matches is split at its capitals.
    The name depends on the Node's class alone and is cached per class.
    """
    cls = type(node)
    name = _op_names_by_class.get(cls)
    if name is None:
        class_name = cls.__name__
        stem = _BACKWARD_SUFFIX.sub("", class_name) or class_name
        if is_custom_function(node):
            name = stem
        else:
            split = _CAMEL_BOUNDARY.sub("_", stem).lower()
            name = _aten_names().get(_squashed(stem), split)
        _op_names_by_class[cls] = name
    return name


def gradient_edge(tensor: torch.Tensor) -> GradientEdge:
    """``torch.autograd.graph.get_gradient_edge(tensor)``, right for a leaf of a Tensor subclass too.

    For a leaf, ``get_gradient_edge`` finds the AccumulateGrad Node as the next function of
    ``tensor.view_as(tensor)``; on a subclass that view goes through ``__torch_function__``, whose
    re-wrapping returns another view Node instead. With subclass dispatch off
    (``torch._C.DisableTorchFunctionSubclass``) the view is a plain one on the leaf itself, as the
    engine sees it (``impl::gradient_edge`` in C++).

    Raises:
        RuntimeError: ``tensor`` does not require grad (as ``get_gradient_edge``).
    """
    if tensor.grad_fn is not None or type(tensor) in (torch.Tensor, torch.nn.Parameter):
        return get_gradient_edge(tensor)
    if not tensor.requires_grad:
        return get_gradient_edge(tensor)  # raises PyTorch's own error
    with torch._C.DisableTorchFunctionSubclass(), torch.enable_grad():
        view = torch.Tensor.view_as(tensor, tensor)
        node = view.grad_fn.next_functions[0][0] if view.grad_fn is not None else None
    if node is None or not is_accumulate_grad(node):
        return get_gradient_edge(tensor)
    return GradientEdge(node, 0)


def gradient_metadata(node: Node) -> tuple[GradientMetadata, ...] | None:
    """Metadata of every gradient ``node`` receives, in output order, or None if PyTorch hides it.

    Uses the private ``Node._input_metadata`` (the engine's InputMetadata: what ``validate_outputs`` in
    ``torch/csrc/autograd/engine.cpp`` checks incoming gradients against).
    """
    try:
        metadata = node._input_metadata
    except (AttributeError, RuntimeError):  # older releases; custom Functions on some releases refuse it
        return None
    result = []
    for entry in metadata:
        result.append(GradientMetadata(tuple(entry.shape), entry.dtype, entry.device))
    return tuple(result)


def sequence_number(node: Node) -> int:
    """The autograd sequence number of ``node`` (creation order within a thread; AccumulateGrad is max)."""
    return int(node._sequence_nr())


def set_sequence_number(node: Node, number: int) -> bool:
    """Give ``node`` the sequence number ``number``; False where PyTorch offers no way to.

    The engine's ready queue runs the ready Node with the highest sequence number first
    (``CompareNodeTaskTime`` in ``torch/csrc/autograd/engine.cpp``), so this places a Node made later
    among the Nodes of an older forward. Uses the private ``Node._set_sequence_nr``.
    """
    setter = getattr(node, "_set_sequence_nr", None)
    if setter is None:
        return False
    setter(number)
    return True


_OWN_HOOK = "_graphkit_own_hook"


def mark_own_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``hook`` (a function or ``functools.partial``) as graphkit's own: :func:`post_hooks_beside` skips it."""
    setattr(hook, _OWN_HOOK, True)
    return hook


def post_hooks_beside(handle: Any, hook: Callable[..., Any]) -> tuple[Callable[..., Any], ...]:
    """The other Python post-hooks of the Node that ``hook`` was just registered on, graphkit's own left out.

    ``handle`` is what ``node.register_hook(hook)`` returned. A post-hook receives every gradient the
    Node computed and may replace them. PyTorch keeps a Node's Python post-hooks in one dict and has no
    getter for it, but the ``RemovableHandle`` of a registration refers to that dict
    (``hooks_dict_ref()``; ``registerFunctionHook`` in ``torch/csrc/autograd/python_cpp_function.cpp``
    adds every Python post-hook of a Node to the same dict). Module full backward hooks are among them:
    PyTorch runs them from post-hooks on the identity Nodes that stand for a module's inputs and outputs
    (``BackwardHook`` in ``torch/utils/hooks.py``). Empty where PyTorch offers no such dict.
    """
    reference = getattr(handle, "hooks_dict_ref", None)
    hooks = reference() if reference is not None else None
    if not hooks or len(hooks) == 1:
        return ()
    return tuple(
        other for other in hooks.values() if other is not hook and not getattr(other, _OWN_HOOK, False)
    )


_saved_names_by_class: dict[type, tuple[str, ...]] = {}


def _saved_attribute_names(node: Node) -> tuple[str, ...]:
    cls = type(node)
    names = _saved_names_by_class.get(cls)
    if names is None:
        names = tuple(
            name
            for name in dir(node)
            if name.startswith("_saved_") and not name.endswith(("_sym_sizes", "_sym_strides"))
        )
        _saved_names_by_class[cls] = names
    return names


_raw_saved_names_by_class: dict[type, tuple[str, ...]] = {}


def uses_saved_tensor_hooks(node: Node) -> bool:
    """True when a tensor ``node`` saved was packed by ``torch.autograd.graph.saved_tensors_hooks``.

    Non-reentrant activation checkpointing (``torch.utils.checkpoint(..., use_reentrant=False)``) and
    CPU offloading work this way; unpacking such a tensor runs user code (checkpointing recomputes the
    forward), so graphkit does not read them. Uses the private ``_raw_saved_<name>`` attributes and
    ``SavedTensor.unpack_hook``; False on a PyTorch that does not expose them.
    """
    cls = type(node)
    names = _raw_saved_names_by_class.get(cls)
    if names is None:
        names = tuple(name for name in dir(node) if name.startswith("_raw_saved_"))
        _raw_saved_names_by_class[cls] = names
    for attribute in names:
        value = getattr(node, attribute, None)
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if getattr(item, "unpack_hook", None) is not None:
                return True
    return False


def _tensor_info(name: str, tensor: torch.Tensor) -> SavedTensorInfo:
    return SavedTensorInfo(
        name=name,
        shape=tuple(tensor.shape),
        dtype=str(tensor.dtype).removeprefix("torch."),
        bytes=tensor.numel() * tensor.element_size(),
    )


def saved_tensors(node: Node) -> tuple[list[SavedTensorInfo], list[torch.Tensor]] | None:
    """The tensors ``node`` saved for backward, as descriptions and the tensors themselves.

    Returns None when the graph was already freed (``FREED_GRAPH_REASON``) or when the tensors were packed
    by ``torch.autograd.graph.saved_tensors_hooks`` (``HOOKED_SAVED_TENSORS_REASON``; see
    :func:`uses_saved_tensor_hooks`): reading those would run the unpack hook.
    """
    infos: list[SavedTensorInfo] = []
    tensors: list[torch.Tensor] = []
    if uses_saved_tensor_hooks(node):
        return None
    try:
        if is_custom_function(node):
            for index, tensor in enumerate(node.saved_tensors):
                if isinstance(tensor, torch.Tensor):
                    infos.append(_tensor_info(f"saved_tensors[{index}]", tensor))
                    tensors.append(tensor)
            for index, tensor in enumerate(getattr(node, "held_tensors", ())):
                infos.append(_tensor_info(f"held_tensors[{index}]", tensor))
                tensors.append(tensor)
            return infos, tensors
        for attribute in _saved_attribute_names(node):
            value = getattr(node, attribute)
            name = attribute.removeprefix("_saved_")
            if isinstance(value, torch.Tensor):
                infos.append(_tensor_info(name, value))
                tensors.append(value)
            elif isinstance(value, (tuple, list)):
                for index, item in enumerate(value):
                    if isinstance(item, torch.Tensor):
                        infos.append(_tensor_info(f"{name}[{index}]", item))
                        tensors.append(item)
    except RuntimeError as error:
        if "freed" in str(error) or "second time" in str(error):
            return None
        raise
    return infos, tensors


def storage_key(tensor: torch.Tensor) -> int:
    """A number that tells storages apart: the data pointer; for a ``meta`` tensor (no data, pointer 0)
    the address of its StorageImpl, which views share (private ``UntypedStorage._cdata``)."""
    storage = tensor.untyped_storage()
    if tensor.device.type == "meta":
        return int(storage._cdata)
    return storage.data_ptr()


def run_engine_backward(
    roots: Sequence[GradientEdge],
    grads: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    keep_graph: bool = False,
) -> None:
    """Run the autograd engine from ``roots`` and accumulate into the ``.grad`` of ``inputs``.

    The same engine call as ``torch.autograd.backward(roots, grads, inputs=inputs)``, without its
    argument checks: ``torch.autograd._make_grads`` validates every root gradient in Python (about
    0.1 ms per GradientEdge root, more than the W phase's own work on small stages). The engine still
    checks each root gradient against its edge in C++ (``validate_outputs``: it sums a broadcast
    gradient down to the edge's shape, casts its dtype, and raises on a shape it cannot reduce), so a
    wrong gradient fails loudly. Uses the private ``torch.autograd.graph._engine_run_backward``; falls
    back to the public call where it is missing. ``keep_graph``: as ``retain_graph``. Empty ``inputs``:
    every leaf the roots reach, as ``torch.autograd.backward`` without ``inputs=``.
    """
    engine_call = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if engine_call is None:
        torch.autograd.backward(
            list(roots), grad_tensors=list(grads), inputs=list(inputs) or None, retain_graph=keep_graph
        )
        return
    engine_call(
        tuple(roots),
        tuple(grads),
        keep_graph,
        False,
        tuple(inputs),
        allow_unreachable=True,
        accumulate_grad=True,
    )


def run_engine_grad(
    outputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True)``, leaner.

    Skips the Python-side argument handling of ``torch.autograd.grad`` (about 10 microseconds a call;
    graphkit has already matched every cotangent's shape to its output, and the engine checks them
    again in C++). Returns one gradient per input, None where none flows. Uses the private
    ``torch.autograd.graph._engine_run_backward``; falls back to the public call where it is missing.
    """
    engine_call = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if engine_call is None:
        return torch.autograd.grad(
            list(outputs), list(inputs), grad_outputs=list(grads), retain_graph=True, allow_unused=True
        )
    return engine_call(
        tuple(outputs),
        tuple(grads),
        True,
        False,
        tuple(inputs),
        allow_unreachable=True,
        accumulate_grad=False,
    )


def engine_execution_query() -> Callable[[Node], bool]:
    """``torch._C._will_engine_execute_node``: whether the running backward task will execute a Node."""
    return torch._C._will_engine_execute_node


def replace_engine_execution_query(function: Callable[[Node], bool]) -> None:
    """Answer :func:`engine_execution_query` through ``function`` (looked up when a multi-grad hook runs)."""
    torch._C._will_engine_execute_node = function


def asked_by_multi_grad_hook(depth: int) -> bool:
    """Whether the frame ``depth`` levels above the caller is a ``register_multi_grad_hook`` hook's closure."""
    caller = sys._getframe(depth + 1)
    return caller.f_code.co_name == "inner_hook" and "register_multi_grad_hook" in getattr(
        caller.f_code, "co_qualname", ""
    )
