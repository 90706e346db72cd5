"""B without a walk (graphkit.split.weight_queue): stages whose parameters all lie inside regions compiled by
graphkit.splitting_backend() queue each region's W per microbatch, and W runs that queue.

The oracle is the same blocks compiled the usual way (``backend="aot_eager"``), one full backward per
microbatch: with ``aot_eager`` as the inner compiler, B then W must give the very same bits, in any W order.
"""

from __future__ import annotations

import gc
import threading
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from graphkit.measure.benchmark import memory_kept
from graphkit.split import GraphFreedError, SplitError, backward_input, backward_weight
from graphkit.split.compile_backend import splitting_backend
from graphkit.split.weight_queue import (
    NO_WALK,
    WALK,
    PendingWeightWarning,
    forget_decisions,
    walking_always,
)

WIDTH = 8


class Block(nn.Module):
    """LayerNorm, Linear, GELU, Linear with a residual: every parameter inside the compiled region."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.first = nn.Linear(WIDTH, 2 * WIDTH)
        self.second = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.second(nn.functional.gelu(self.first(self.norm(x))))


class Stage(nn.Module):
    """Three compiled blocks with parameter-free glue between them (a scale and a tanh); optionally an
    eager Linear in the glue after the first block (``glue_linear``), used on the microbatches ``use_glue``
    says; ``skip_middle`` leaves out the second block."""

    def __init__(self, backend, *, glue_linear: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.compiled = [torch.compile(block, backend=backend) for block in self.blocks]
        self.glue = nn.Linear(WIDTH, WIDTH) if glue_linear else None
        self.use_glue = False
        self.skip_middle = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for position, block in enumerate(self.compiled):
            if position == 1 and self.skip_middle:
                continue
            x = torch.tanh(block(x)) * 1.5
            if position == 0 and self.glue is not None and self.use_glue:
                x = self.glue(x)
        return x


@pytest.fixture(scope="module")
def stages():
    """The split stage and its oracle (same weights), built once: compiling is the slow part."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    split = Stage(splitting_backend("aot_eager"), glue_linear=True)
    reference = Stage("aot_eager", glue_linear=True)
    reference.load_state_dict(split.state_dict())
    yield split, reference
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _fresh_decisions():
    forget_decisions()
    yield
    forget_decisions()


def _microbatches(count: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(4, WIDTH, generator=generator), torch.randn(4, WIDTH, generator=generator))
        for _ in range(count)
    ]


def _full_gradients(reference: Stage, x: torch.Tensor, grad: torch.Tensor):
    """One microbatch's parameter and input gradients by a full backward (the oracle)."""
    reference.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    reference(x).backward(grad)
    return [None if p.grad is None else p.grad.clone() for p in reference.parameters()], x.grad


def _reset(stage: Stage, **flags: bool) -> None:
    stage.zero_grad(set_to_none=True)
    stage.use_glue = flags.get("use_glue", False)
    stage.skip_middle = flags.get("skip_middle", False)


def test_no_walk_b_then_w_is_bit_for_bit_a_full_backward_in_any_w_order(stages):
    split, reference = stages
    _reset(split)
    _reset(reference)
    batches = _microbatches(3)
    expected = [_full_gradients(reference, x, g) for x, g in batches]
    states = []
    for x, g in batches:
        x = x.clone().requires_grad_()
        out = split(x)
        states.append(backward_input(out, g, x))
        assert states[-1].path == NO_WALK
        assert states[-1].num_intermediates == 3
        assert all(p.grad is None for p in split.parameters()), "a weight gradient arrived in B"
        del out
    order = (2, 0, 1)
    for position in order:
        backward_weight(states[position])
    for index, parameter in enumerate(split.parameters()):
        if parameter is split.glue.weight or parameter is split.glue.bias:
            assert parameter.grad is None
            continue
        # AccumulateGrad: the first gradient is taken over, each later one added in place, in W's order
        total = expected[order[0]][0][index].clone()
        for position in order[1:]:
            total += expected[position][0][index]
        assert torch.equal(parameter.grad, total), index
    for state, (_, input_grad) in zip(states, expected, strict=True):
        assert torch.equal(state.input_grads[0], input_grad)


def test_a_parameter_in_the_glue_makes_b_walk_and_stay_exact(stages):
    split, reference = stages
    _reset(split, use_glue=True)
    _reset(reference, use_glue=True)
    ((x, g),) = _microbatches(1, seed=2)
    expected, input_grad = _full_gradients(reference, x, g)
    x = x.clone().requires_grad_()
    state = backward_input(split(x), g, x)  # the first B of this structure qualifies it by a walk
    assert state.path == WALK
    backward_weight(state)
    assert all(torch.equal(p.grad, e) for p, e in zip(split.parameters(), expected, strict=True))
    assert torch.equal(state.input_grads[0], input_grad)


def test_params_naming_a_parameter_no_region_covers_makes_b_walk(stages):
    split, _ = stages
    _reset(split)
    ((x, g),) = _microbatches(1, seed=3)
    x = x.clone().requires_grad_()
    state = backward_input(split(x), g, x, params=list(split.parameters()))  # the glue Linear's too
    assert state.path == WALK
    backward_weight(state)
    x = x.detach().clone().requires_grad_()
    state = backward_input(split(x), g, x, params=list(split.blocks.parameters()))
    assert state.path == NO_WALK
    backward_weight(state)


def test_a_region_skipped_on_one_microbatch_is_qualified_again_and_exact(stages):
    split, reference = stages
    for skip in (False, True, False):
        _reset(split, skip_middle=skip)
        _reset(reference, skip_middle=skip)
        ((x, g),) = _microbatches(1, seed=4)
        expected, input_grad = _full_gradients(reference, x, g)
        x = x.clone().requires_grad_()
        state = backward_input(split(x), g, x)
        assert state.path == NO_WALK
        assert state.num_intermediates == (2 if skip else 3)
        backward_weight(state)
        for parameter, wanted in zip(split.parameters(), expected, strict=True):
            assert (parameter.grad is None) if wanted is None else torch.equal(parameter.grad, wanted)
        assert torch.equal(state.input_grads[0], input_grad)


def test_a_glue_parameter_appearing_later_fails_loudly_then_b_walks(stages):
    split, reference = stages
    _reset(split)
    ((x, g),) = _microbatches(1, seed=5)
    x = x.clone().requires_grad_()
    backward_weight(backward_input(split(x), g, x))  # the structure qualifies for B without a walk
    _reset(split, use_glue=True)
    x = x.detach().clone().requires_grad_()
    # the same output Node class and the same region nearest to it, but a Linear in the glue below:
    # the regions ran their I before B could see it (without params=)
    with pytest.raises(SplitError, match="outside the regions compiled by graphkit.splitting_backend"):
        backward_input(split(x), g, x)
    _reset(split, use_glue=True)
    _reset(reference, use_glue=True)
    expected, _ = _full_gradients(reference, x.detach(), g)
    x = x.detach().clone().requires_grad_()
    state = backward_input(split(x), g, x)
    assert state.path == WALK
    backward_weight(state)
    assert all(torch.equal(p.grad, e) for p, e in zip(split.parameters(), expected, strict=True))


def test_with_params_a_glue_parameter_on_some_microbatches_only_keeps_b_walking(stages):
    split, reference = stages
    for use_glue in (False, True):
        _reset(split, use_glue=use_glue)
        _reset(reference, use_glue=use_glue)
        ((x, g),) = _microbatches(1, seed=12)
        expected, _ = _full_gradients(reference, x, g)
        x = x.clone().requires_grad_()
        state = backward_input(split(x), g, x, params=split)
        assert state.path == WALK
        backward_weight(state)
        for parameter, wanted in zip(split.parameters(), expected, strict=True):
            assert (parameter.grad is None) if wanted is None else torch.equal(parameter.grad, wanted)


def test_w_twice_raises_and_so_does_another_backward_after_b(stages):
    split, _ = stages
    _reset(split)
    ((x, g),) = _microbatches(1, seed=6)
    x = x.clone().requires_grad_()
    out = split(x)
    state = backward_input(out, g, x)
    assert state.path == NO_WALK
    with pytest.raises(RuntimeError, match="queued its weight gradients"):
        torch.autograd.backward(out, g)
    with pytest.raises(GraphFreedError, match="another backward ran"):
        backward_weight(state)
    with pytest.warns(PendingWeightWarning):
        del state
        gc.collect()
    x = x.detach().clone().requires_grad_()
    state = backward_input(split(x), g, x)
    backward_weight(state)
    with pytest.raises(SplitError, match="already used"):
        backward_weight(state)


def test_a_state_dropped_with_its_w_pending_warns(stages):
    split, _ = stages
    _reset(split)
    ((x, g),) = _microbatches(1, seed=7)
    x = x.clone().requires_grad_()
    state = backward_input(split(x), g, x)
    assert state.path == NO_WALK
    with pytest.warns(PendingWeightWarning, match="W of 3 compiled region"):
        del state
        gc.collect()


def test_the_queue_counts_in_memory_and_w_releases_it(stages):
    split, _ = stages
    _reset(split)
    ((x, g),) = _microbatches(1, seed=8)
    x = x.clone().requires_grad_()
    out = split(x)
    state = backward_input(out, g, x)
    retained, needs = memory_kept(state)
    assert retained > 0 and needs > 0
    assert state.held_tensors() and state.captured_tensors()
    backward_weight(state)
    assert state.held_tensors() == []


def test_hooks_and_existing_grad_accumulate_as_in_a_full_backward(stages):
    split, reference = stages
    _reset(split)
    _reset(reference)
    ((x, g),) = _microbatches(1, seed=9)
    expected, _ = _full_gradients(reference, x, g)
    weight = split.blocks[0].first.weight
    seen: list[str] = []
    hooks = [
        weight.register_hook(lambda grad: seen.append("tensor") or grad * 2),
        weight.register_post_accumulate_grad_hook(lambda tensor: seen.append("accumulated")),
    ]
    try:
        weight.grad = torch.ones_like(weight)
        x = x.clone().requires_grad_()
        state = backward_input(split(x), g, x)
        assert state.path == NO_WALK and seen == []
        backward_weight(state)
    finally:
        for hook in hooks:
            hook.remove()
    assert seen == ["tensor", "accumulated"]
    index = [p is weight for p in split.parameters()].index(True)
    assert torch.equal(weight.grad, torch.ones_like(weight) + expected[index] * 2)


def test_microbatches_on_two_threads_keep_their_own_queues(stages):
    split, reference = stages
    _reset(split)
    _reset(reference)
    batches = _microbatches(2, seed=10)
    expected = [_full_gradients(reference, x, g) for x, g in batches]
    states: dict[int, object] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)
    lock = threading.Lock()

    def run(position: int) -> None:
        try:
            x, g = batches[position]
            x = x.clone().requires_grad_()
            with lock:  # dynamo's guards and the forward on one thread at a time; B concurrently
                out = split(x)
            barrier.wait(timeout=30)
            states[position] = backward_input(out, g, x)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(position,)) for position in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    for position in (1, 0):
        backward_weight(states[position])
    for index, parameter in enumerate(split.parameters()):
        if expected[0][0][index] is None:
            continue
        total = expected[1][0][index].clone()
        total += expected[0][0][index]
        assert torch.equal(parameter.grad, total), index
    for position in range(2):
        assert torch.equal(states[position].input_grads[0], expected[position][1])


def test_walking_always_makes_b_walk_and_both_paths_agree(stages):
    split, _ = stages
    ((x, g),) = _microbatches(1, seed=13)
    grads = {}
    for walk in (True, False):
        _reset(split)
        x = x.detach().clone().requires_grad_()
        out = split(x)
        if walk:
            with walking_always():
                state = backward_input(out, g, x)
        else:
            state = backward_input(out, g, x)
        assert state.path == (WALK if walk else NO_WALK)
        backward_weight(state)
        grads[walk] = [p.grad for p in split.parameters()]
    for walked, queued in zip(grads[True], grads[False], strict=True):
        assert (walked is None and queued is None) or torch.equal(walked, queued)


def test_a_parameter_returned_as_an_output_or_passed_as_an_input_makes_b_walk(stages):
    split, reference = stages
    _reset(split)
    _reset(reference)
    ((x, g),) = _microbatches(1, seed=14)
    weight = split.blocks[2].second.weight
    reference_weight = reference.blocks[2].second.weight
    x_reference = x.clone().requires_grad_()
    torch.autograd.backward([reference(x_reference), reference_weight], [g, torch.ones_like(weight)])
    x = x.clone().requires_grad_()
    state = backward_input([split(x), weight], [g, torch.ones_like(weight)], x)
    assert state.path == WALK  # the weight's own cotangent reaches no stage input
    backward_weight(state)
    assert torch.equal(weight.grad, reference_weight.grad)
    assert torch.equal(state.input_grads[0], x_reference.grad)

    _reset(split)
    x = x.detach().clone().requires_grad_()
    state = backward_input(split(x), g, [x, weight])  # the region counts it a weight: B owes its gradient
    assert state.path == WALK
    backward_weight(state)
    assert weight.grad is None and state.input_grads[1] is not None


def test_a_plain_backward_through_split_regions_is_untouched(stages):
    split, reference = stages
    _reset(split)
    _reset(reference)
    ((x, g),) = _microbatches(1, seed=11)
    expected, _ = _full_gradients(reference, x, g)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PendingWeightWarning)
        split(x.clone().requires_grad_()).backward(g)
    assert all(
        (p.grad is None) if e is None else torch.equal(p.grad, e)
        for p, e in zip(split.parameters(), expected, strict=True)
    )


def test_the_blocks_of_a_compiled_pipeline_spec_take_the_no_walk_path():
    from graphkit.models.pipeline_specs import load_pipeline_spec
    from graphkit.split.compile_backend import register_backends

    register_backends()
    torch._dynamo.reset()
    model = load_pipeline_spec("zoo-pipeline:mlp?compile=split-eager", num_stages=2, batch_size=4, seed=0)
    (stage, _) = model.stages
    (x,) = model.inputs
    paths = []
    for _ in range(2):
        x = x.detach().clone().requires_grad_()
        out = stage(x)
        # as graphkit's PipelineStage calls it: the stage's parameters named
        state = backward_input(out, torch.ones_like(out), x, params=list(stage.parameters()))
        paths.append(state.path)
        backward_weight(state)
    assert paths == [NO_WALK, NO_WALK]
    torch._dynamo.reset()


def test_verify_split_on_the_no_walk_path_is_exact_and_counts_each_regions_w(stages):
    import graphkit

    split, _ = stages
    _reset(split)
    x = torch.randn(4, WIDTH, requires_grad=True)
    graphkit.verify_split(split, (x,))  # the first B of the structure walks to qualify it
    report = graphkit.verify_split(split, (x,))
    assert report.ok, report.table()
    assert all(check.status == "ok" and check.bitwise for check in report.params + report.inputs)
    regions = [node for node in report.opaque if node.kind == "split-compiled-region"]
    assert len(regions) == 3
    for node in regions:  # I in B, W in W, nothing twice
        assert node.flops["b"] > 0 and node.flops["w"] > 0
        assert node.flops["b"] + node.flops["w"] == node.flops["full"]


class _RandomStage(nn.Module):
    """Compiled blocks joined by parameter-free glue drawn per gap (tanh, a scale, a residual from the
    stage input, a split-and-add), every parameter inside a block."""

    def __init__(self, backend, glue: list[str], width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in glue
        )
        self.compiled = [torch.compile(block, backend=backend) for block in self.blocks]
        self.glue = glue

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for block, glue in zip(self.compiled, self.glue, strict=True):
            h = block(h)
            if glue == "tanh":
                h = torch.tanh(h)
            elif glue == "scale":
                h = h * 0.5
            elif glue == "residual":
                h = h + x
            else:  # halves added back
                first, second = h.chunk(2, dim=-1)
                h = torch.cat([first + second, second], dim=-1)
        return h


@settings(max_examples=8, deadline=None)
@given(st.data())
def test_no_walk_is_bit_for_bit_on_random_compiled_stages_in_any_w_order(data):
    glue = data.draw(
        st.lists(st.sampled_from(["tanh", "scale", "residual", "halves"]), min_size=1, max_size=3)
    )
    width = data.draw(st.sampled_from([4, 8]))
    count = data.draw(st.integers(2, 3))
    order = data.draw(st.permutations(range(count)))
    with_params = data.draw(st.booleans())
    torch._dynamo.reset()
    torch.manual_seed(0)
    split = _RandomStage(splitting_backend("aot_eager"), glue, width)
    reference = _RandomStage("aot_eager", glue, width)
    reference.load_state_dict(split.state_dict())
    generator = torch.Generator().manual_seed(count)
    batches = [
        (torch.randn(3, width, generator=generator), torch.randn(3, width, generator=generator))
        for _ in range(count)
    ]
    expected = []
    for x, g in batches:
        reference.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()
        reference(x).backward(g)
        expected.append(([p.grad.clone() for p in reference.parameters()], x.grad))
    forget_decisions()
    states = []
    for x, g in batches:
        x = x.clone().requires_grad_()
        params = list(split.parameters()) if with_params else None
        states.append(backward_input(split(x), g, x, params=params))
    assert [state.path for state in states] == [NO_WALK] * count  # the first B qualifies the stage by a walk
    for position in order:
        backward_weight(states[position])
    for index, parameter in enumerate(split.parameters()):
        total = expected[order[0]][0][index].clone()
        for position in order[1:]:
            total += expected[position][0][index]
        assert torch.equal(parameter.grad, total), index
    for state, (_, input_grad) in zip(states, expected, strict=True):
        assert torch.equal(state.input_grads[0], input_grad)
    torch._dynamo.reset()
