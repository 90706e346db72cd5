"""FLOPs per Node under the split backward: counted where W calls a Node itself, and isolated per thread."""

from __future__ import annotations

import threading

import torch

import graphkit
from graphkit.measure.flops import FlopCounter, flops_per_node
from graphkit.split import backward as backward_module

ROWS, INNER, COLUMNS = 6, 5, 4


class LinearNoBias(torch.autograd.Function):
    """``x @ weight.T`` whose backward computes only the gradients the engine asks for."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x @ weight.T

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.T @ x if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight


def _split_stage(
    seed: int,
) -> tuple[graphkit.SplitState, torch.autograd.graph.Node, torch.nn.Parameter, torch.Tensor]:
    """B of ``LinearNoBias(x, weight)``: the state, the Function's Node, the weight and its expected gradient."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, INNER, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(COLUMNS, INNER, generator=generator, dtype=torch.float64))
    output = LinearNoBias.apply(x, weight)
    grad_output = torch.randn(ROWS, COLUMNS, generator=generator, dtype=torch.float64)
    node = output.grad_fn
    state = graphkit.backward_input(output, grad_output, inputs=x, params=[weight])
    return state, node, weight, grad_output.T @ x.detach()


# W computes only grad_weight = grad_output.T @ x: a (COLUMNS, ROWS) @ (ROWS, INNER) matmul.
WEIGHT_SIDE_FLOPS = 2 * COLUMNS * ROWS * INNER


def test_a_custom_function_that_w_calls_itself_is_counted_for_its_weight_side_only() -> None:
    state, node, weight, expected_grad = _split_stage(0)
    with FlopCounter() as counter, flops_per_node(counter, {"linear": node}) as found:
        graphkit.backward_weight(state)
    assert found == {"linear": WEIGHT_SIDE_FLOPS}
    assert counter.get_total_flops() == WEIGHT_SIDE_FLOPS
    torch.testing.assert_close(weight.grad, expected_grad, rtol=0, atol=0)


def test_nested_counters_both_see_the_call_and_leave_nothing_behind() -> None:
    state, node, _, _ = _split_stage(1)
    with FlopCounter() as counter:
        with (
            flops_per_node(counter, {"outer": node}) as outer,
            flops_per_node(counter, {"inner": node}) as inner,
        ):
            graphkit.backward_weight(state)
    assert outer == {"outer": WEIGHT_SIDE_FLOPS} and inner == {"inner": WEIGHT_SIDE_FLOPS}
    assert backward_module._direct_call_observers.get() == ()


def test_counters_in_two_threads_stay_separate_whatever_order_they_end_in() -> None:
    call_node, call_custom_function = backward_module._call_node, backward_module.call_custom_function
    started, ran = threading.Barrier(2, timeout=30), threading.Barrier(2, timeout=30)
    first_done = threading.Event()
    results: dict[int, dict[str, int]] = {}
    errors: list[BaseException] = []

    def count(index: int) -> None:
        try:
            state, node, _, _ = _split_stage(10 + index)
            with FlopCounter() as counter, flops_per_node(counter, {f"linear{index}": node}) as found:
                started.wait()  # both counters are active at once
                graphkit.backward_weight(state)
                ran.wait()
                if index == 1:
                    first_done.wait(timeout=30)  # the counter that started second ends second
            if index == 0:
                first_done.set()
            results[index] = dict(found)
        except BaseException as error:  # reported by the main thread
            errors.append(error)
            first_done.set()

    threads = [threading.Thread(target=count, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert results == {0: {"linear0": WEIGHT_SIDE_FLOPS}, 1: {"linear1": WEIGHT_SIDE_FLOPS}}
    # nothing global was patched, so nothing can be left patched
    assert backward_module._call_node is call_node
    assert backward_module.call_custom_function is call_custom_function
