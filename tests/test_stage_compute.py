"""StageCompute: a two-stage pipeline run in a zero-bubble order matches one model's full backward."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from graphkit.split.stage_compute import StageCompute, StageError


class First(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(20, 8)
        self.layer = nn.Linear(8, 8)

    def forward(self, tokens):
        return {"hidden": torch.tanh(self.layer(self.embedding(tokens))), "unused": None}


class Second(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, hidden):
        return {"loss": self.head(torch.relu(self.layer(hidden))).pow(2).mean()}


def _microbatches(count=4):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 20, (2, 5), generator=generator) for _ in range(count)]


def test_two_stages_in_zero_bubble_order_match_a_full_backward():
    torch.manual_seed(0)
    first, second = First().double(), Second().double()
    reference_first, reference_second = copy.deepcopy(first), copy.deepcopy(second)
    batches = _microbatches()
    for tokens in batches:
        reference_second(reference_first(tokens)["hidden"])["loss"].backward()

    stage0, stage1 = StageCompute(first, 0), StageCompute(second, 1)
    for index, tokens in enumerate(batches):
        sent = stage0.forward(index, {"tokens": tokens})
        assert set(sent) == {"hidden"}, "None outputs are dropped"
        received = sent["hidden"].detach().requires_grad_()
        stage1.forward(index, {"hidden": received})
    # B for every microbatch first (the critical path), W later in reverse order to fill bubbles
    for index in range(len(batches)):
        stage1.backward_input(index, None)
        grads = stage1.pop_input_grads(index)
        stage0.backward_input(index, {"hidden": grads["hidden"]})
        assert stage0.pop_input_grads(index) == {}, "token ids need no gradient"
    for parameter in [*first.parameters(), *second.parameters()]:
        assert parameter.grad is None, "no weight gradient before W"
    for index in reversed(range(len(batches))):
        stage1.backward_weight(index)
        stage0.backward_weight(index)

    for module, reference in ((first, reference_first), (second, reference_second)):
        for (name, parameter), (_, expected) in zip(
            module.named_parameters(), reference.named_parameters(), strict=True
        ):
            torch.testing.assert_close(parameter.grad, expected.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_full_backward_path_and_sending():
    torch.manual_seed(0)
    second = Second().double()
    stage = StageCompute(second, 1)
    hidden = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    stage.forward(0, {"hidden": hidden})
    stage.backward_full(0, None)
    grads = stage.pop_input_grads(0)
    reference = copy.deepcopy(second)
    check = hidden.detach().clone().requires_grad_()
    reference(check)["loss"].backward()
    torch.testing.assert_close(grads["hidden"], check.grad)
    assert hidden.grad is None


def test_a_lone_tensor_output_is_wrapped_and_a_tuple_is_refused():
    stage = StageCompute(nn.Linear(3, 3), 0)
    outputs = stage.forward(0, {"input": torch.randn(2, 3)})
    assert list(outputs) == ["output"]

    class ReturnsTuple(nn.Module):
        def forward(self, x):
            return x, x

    with pytest.raises(StageError, match="dict of tensors"):
        StageCompute(ReturnsTuple(), 2).forward(0, {"x": torch.randn(2)})


def _stage_with_forward():
    stage = StageCompute(Second(), 1)
    stage.forward(0, {"hidden": torch.randn(2, 5, 8, requires_grad=True)})
    return stage


def test_double_backward_is_an_error():
    stage = _stage_with_forward()
    stage.backward_input(0, None)
    with pytest.raises(StageError, match="double backward"):
        stage.backward_input(0, None)


def test_weight_before_input_is_an_error():
    stage = _stage_with_forward()
    with pytest.raises(StageError, match="weight backward with no input backward"):
        stage.backward_weight(0)


def test_weight_twice_is_an_error():
    stage = _stage_with_forward()
    stage.backward_input(0, None)
    stage.backward_weight(0)
    with pytest.raises(StageError, match="weight backward with no input backward"):
        stage.backward_weight(0)


def test_popping_a_null_gradient_is_an_error():
    class IgnoresInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, hidden, other):
            return {"loss": (hidden * self.scale).sum()}

    stage = StageCompute(IgnoresInput(), 1)
    stage.forward(
        0, {"hidden": torch.randn(3, requires_grad=True), "other": torch.randn(3, requires_grad=True)}
    )
    stage.backward_input(0, None)
    with pytest.raises(StageError, match="null gradient.*other"):
        stage.pop_input_grads(0)


def test_pop_before_backward_and_twice_are_errors():
    stage = _stage_with_forward()
    with pytest.raises(StageError, match="no input gradients"):
        stage.pop_input_grads(0)
    stage.backward_full(0, None)
    stage.pop_input_grads(0)
    with pytest.raises(StageError, match="no input gradients"):
        stage.pop_input_grads(0)


def test_gradient_for_an_unknown_output_is_an_error():
    stage = _stage_with_forward()
    with pytest.raises(StageError, match="did not return"):
        stage.backward_input(0, {"logits": torch.ones(1)})


def test_forward_failure_names_the_stage_and_microbatch():
    stage = StageCompute(nn.Linear(3, 3), 4)
    with pytest.raises(StageError, match="stage 4, microbatch 7"):
        stage.forward(7, {"input": torch.randn(2, 5)})


def test_a_rejected_backward_keeps_the_forward_for_a_corrected_retry():
    stage = _stage_with_forward()
    with pytest.raises(StageError, match="did not return"):
        stage.backward_input(0, {"logits": torch.ones(1)})
    stage.backward_input(0, None)  # the forward is still cached
    stage.backward_weight(0)


def test_a_retry_after_a_failed_weight_backward_says_grad_may_be_partly_written():
    torch.manual_seed(0)
    stage = StageCompute(Second().double(), 1)
    handle = stage.module.head.bias.register_hook(
        lambda grad: (_ for _ in ()).throw(ValueError("hook failed"))
    )
    hidden = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    stage.forward(0, {"hidden": hidden})
    stage.backward_input(0, None)
    stage.pop_input_grads(0)
    with pytest.raises(ValueError, match="hook failed"):
        stage.backward_weight(0)
    handle.remove()
    for _ in range(2):
        with pytest.raises(StageError, match=r"microbatch 0: .*already ran and failed.*\.grad may hold part"):
            stage.backward_weight(0)


def test_a_weight_backward_refused_before_it_started_can_be_retried():
    torch.manual_seed(0)
    module = Second().double()
    reference = copy.deepcopy(module)
    hidden = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    reference(hidden)["loss"].backward()
    stage = StageCompute(module, 1)
    stage.forward(0, {"hidden": hidden.detach().clone().requires_grad_()})
    stage.backward_input(0, None)
    module.head.weight.requires_grad_(False)
    with pytest.raises(Exception, match="stopped requiring grad"):
        stage.backward_weight(0)
    module.head.weight.requires_grad_(True)
    stage.backward_weight(0)
    for (name, parameter), (_, expected) in zip(
        module.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(parameter.grad, expected.grad, rtol=1e-12, atol=0, msg=name)


@pytest.mark.parametrize("second_backward", ["backward_input", "backward_full"])
def test_a_new_backward_of_a_microbatch_whose_w_is_pending_is_refused_instead_of_dropping_that_w(
    second_backward,
):
    # the microbatch id is reused (the next step) before its W ran: the first W's gradients would be lost
    stage = _stage_with_forward()
    stage.backward_input(0, None)
    stage.pop_input_grads(0)
    stage.forward(0, {"hidden": torch.randn(2, 5, 8, requires_grad=True)})
    with pytest.raises(StageError, match="W has not run"):
        getattr(stage, second_backward)(0, None)
    stage.backward_weight(0)  # the pending W is still there, and runs
    assert all(parameter.grad is not None for parameter in stage.module.parameters())
    getattr(stage, second_backward)(0, None)  # now the new microbatch's backward runs


def test_a_new_backward_of_a_microbatch_whose_input_gradients_were_not_popped_is_refused():
    stage = StageCompute(Second(), 1)
    stage.forward(0, {"hidden": torch.randn(2, 5, 8, requires_grad=True)})
    stage.backward_full(0, None)
    stage.forward(0, {"hidden": torch.randn(2, 5, 8, requires_grad=True)})
    with pytest.raises(StageError, match="not popped"):
        stage.backward_full(0, None)


def test_a_first_stage_whose_empty_input_gradients_are_never_popped_runs_the_next_step():
    # token ids need no gradient: nothing is lost when the same microbatch id comes back
    stage = StageCompute(First(), 0)
    for _ in range(2):
        stage.forward(0, {"tokens": torch.randint(0, 20, (2, 5))})
        stage.backward_input(0, {"hidden": torch.ones(2, 5, 8)})
        stage.backward_weight(0)
