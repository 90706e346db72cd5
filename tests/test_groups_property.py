"""Parameter groups on random small models: the partition properties hold on every one hypothesis draws.

:func:`models.random_model` builds random DAGs of linear, elementwise, reduction, chunk, transpose, detach
and in-place ops over one to three inputs (some requiring grad, some not), with parameters used several
times, tied under two names, and outputs that may depend on parameters alone. On each, ``param_groups``
must agree with a full backward (which parameters get a gradient), with the brute-force reference in
``models.reference_param_groups`` (same partition, intermediates, output entries and shared parameters)
and with itself after the parameters are registered in another order.
"""

from __future__ import annotations

import models
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphkit.analysis.parameter_groups import param_groups
from graphkit.graph.autograd_graph import capture


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_random_model_groups_agree_with_full_backward_and_brute_force(data: st.DataObject) -> None:
    module, inputs = models.random_model(data)
    outputs = module(**inputs)
    models.check_param_groups(module, inputs, outputs)


@settings(max_examples=30, deadline=None)
@given(st.data(), st.permutations(range(4)))
def test_random_model_partition_does_not_depend_on_registration_order(
    data: st.DataObject, permutation: list[int]
) -> None:
    module, inputs = models.random_model(data)
    plan = module.plan
    order = [index for index in permutation if index < len(plan.param_shapes)]
    reordered = models.RandomModel(plan, registration_order=order)
    reordered.load_state_dict(module.state_dict())

    first = param_groups(capture(module(**inputs), inputs=inputs, module=module))
    outputs = reordered(**inputs)
    second = param_groups(capture(outputs, inputs=inputs, module=reordered))
    assert models.partition(second) == models.partition(first)
    assert sorted(second.unused_params) == sorted(first.unused_params)
    for expected, got in zip(module(**inputs), outputs, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
