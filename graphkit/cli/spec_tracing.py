"""Build the model a SPEC names and trace one forward of it: the autograd graph the commands work on."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["trace_spec"]


def trace_spec(spec: str, device: str | None = None) -> tuple[torch.nn.Module, Any, Any]:
    """``(module, outputs, graph)`` of one traced forward of the model ``spec`` names.

    Args:
        spec: a model spec (:func:`graphkit.models.specs.load_spec`).
        device: build the model there (``cpu``, ``cuda``, ``meta``: shapes only); None: where the spec
            builds it.

    Raises:
        graphkit.models.specs.SpecError: the spec does not load, or (on ``meta``) its forward reads
            tensor values, which meta tensors do not have.
    """
    from graphkit.graph.tracing import trace
    from graphkit.models.specs import load_spec, load_spec_on, meta_forward_error, spec_inputs_as_call

    module, inputs = load_spec_on(spec, device) if device is not None else load_spec(spec)
    args, kwargs = spec_inputs_as_call(inputs)
    try:
        outputs, graph = trace(module, *args, **kwargs)
    except RuntimeError as error:
        clear = meta_forward_error(spec, error) if device is not None else None
        if clear is None:
            raise
        raise clear from error
    return module, outputs, graph
