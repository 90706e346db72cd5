"""The one gradient comparison that verify_split and verify_pipeline share, and the names it replaced."""

from __future__ import annotations

import math

import pytest
import torch

from graphkit.measure.gradient_check import GradientCheck, compare_gradients
from graphkit.pipelining.verification import ParameterVerification, PipelineCase, PipelineVerification


def test_relative_error_is_the_largest_difference_over_the_largest_reference_magnitude():
    reference = torch.tensor([4.0, -2.0, 1.0], dtype=torch.float64)
    gradient = torch.tensor([4.0, -2.5, 1.0], dtype=torch.float64)
    check = compare_gradients("w", reference, gradient, tolerance=0.2)
    # hand-computed: max |difference| = 0.5, max |reference| = 4
    assert (check.status, check.max_abs_error, check.relative_error) == ("ok", 0.5, 0.125)
    assert check.ok and not check.bitwise
    assert not compare_gradients("w", reference, gradient, tolerance=0.1).ok


def test_missing_unexpected_and_misshapen_gradients_have_no_errors():
    gradient = torch.ones(2)
    assert compare_gradients("w", None, None, 0.0) == GradientCheck("w", "ok", None, None, True)
    assert compare_gradients("w", gradient, None, 0.0).status == "missing"
    assert compare_gradients("w", None, gradient, 0.0).status == "unexpected"
    misshapen = compare_gradients("w", gradient, torch.ones(3), 0.0)
    assert (misshapen.status, misshapen.max_abs_error, misshapen.bitwise) == ("wrong", None, False)


def test_a_difference_from_a_zero_reference_is_infinitely_relative():
    check = compare_gradients("w", torch.zeros(2), torch.tensor([0.0, 1e-30]), 1e-9)
    assert check.relative_error == math.inf and check.status == "wrong"
    assert compare_gradients("w", torch.zeros(2), torch.zeros(2), 0.0).bitwise


def test_a_pipeline_parameter_check_keeps_each_steps_worst():
    check = ParameterVerification("stage0.weight")
    reference = torch.tensor([2.0, 1.0], dtype=torch.float64)
    check.add_step(compare_gradients(check.name, reference, reference.clone(), 1e-10))
    assert check.ok and check.bitwise and check.relative_error == 0.0
    check.add_step(
        compare_gradients(check.name, reference, torch.tensor([2.0, 0.0], dtype=torch.float64), 1e-10)
    )
    check.add_step(compare_gradients(check.name, reference, reference.clone(), 1e-10))
    assert (check.status, check.relative_error, check.bitwise, check.steps_compared) == (
        "wrong",
        0.5,
        False,
        3,
    )
    check.add_step(compare_gradients(check.name, reference, None, 1e-10))
    assert check.status == "wrong" and check.relative_error is None
    assert isinstance(check, GradientCheck)


def test_the_previous_names_still_answer_with_a_deprecation_warning():
    check = GradientCheck("w", "wrong", 0.5, 0.25)
    with pytest.warns(DeprecationWarning, match="max_abs_error"):
        assert check.max_abs_err == 0.5
    with pytest.warns(DeprecationWarning, match="relative_error"):
        assert check.max_rel_err == 0.25
    result = PipelineVerification(PipelineCase("zoo-pipeline:mlp"), 1, error="not run")
    with pytest.warns(DeprecationWarning, match=r"\.ok"):
        assert result.passed is result.ok is False
