"""The split backward's argument fast paths (one tensor, or a list or tuple of plain tensors) pair and name
exactly as the general flattening path does, errors included: random structures, each run both ways."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphkit.graph.tensors import GraphkitInputError, flatten_tensors
from graphkit.split import arguments


def _outcome(function, *args):
    try:
        return "ok", function(*args)
    except GraphkitInputError as error:
        return "error", str(error)


def _same(left, right) -> bool:
    if left[0] != right[0]:
        return False
    if left[0] == "error":
        return left[1] == right[1]
    return len(left[1]) == len(right[1]) and all(
        a is c and torch.equal(b, d) for (a, b), (c, d) in zip(left[1], right[1], strict=True)
    )


@st.composite
def outputs_and_cotangents(draw):
    count = draw(st.integers(1, 3))
    outputs = []
    for _ in range(count):
        shape = draw(st.sampled_from([(), (1,), (2,), (2, 3)]))
        leaf = torch.randn(shape, requires_grad=draw(st.booleans()))
        outputs.append(leaf * 2 if leaf.requires_grad else leaf)
    kind = draw(st.sampled_from(["none", "matching", "wrong shape", "not a tensor", "a None", "too few"]))
    if kind == "none":
        grads = None
    else:
        grads = [torch.ones_like(tensor) for tensor in outputs]
        if kind == "wrong shape":
            grads[draw(st.integers(0, count - 1))] = torch.ones(5)
        elif kind == "not a tensor":
            grads[draw(st.integers(0, count - 1))] = 1.0
        elif kind == "a None":
            grads[draw(st.integers(0, count - 1))] = None
        elif kind == "too few":
            grads = grads[:-1]
    container = draw(st.sampled_from([list, tuple, "lone"]))
    if container == "lone":
        return outputs[0], (grads[0] if grads else grads)
    return container(outputs), (container(grads) if grads is not None else None)


@settings(max_examples=150, deadline=None)
@given(outputs_and_cotangents())
def test_pairs_from_the_fast_path_equal_the_general_paths(case):
    outputs, grads = case
    fast = _outcome(arguments.pair_outputs, outputs, grads)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arguments, "_plain_pairs", lambda *_: None)
        general = _outcome(arguments.pair_outputs, outputs, grads)
    assert _same(fast, general), (fast, general)


@pytest.mark.parametrize(
    "inputs",
    [torch.ones(2), [torch.ones(2), torch.ones(3)], (torch.ones(1),), [], None, {"x": torch.ones(2)}],
)
def test_named_inputs_names_as_flatten_tensors(inputs):
    expected = [] if inputs is None else flatten_tensors(inputs, lone_name="input")
    names = arguments.named_inputs(inputs)
    assert [name for name, _ in names] == [name for name, _ in expected]
    assert all(a is b for (_, a), (_, b) in zip(names, expected, strict=True))
