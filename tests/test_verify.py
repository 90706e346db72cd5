"""verify_split on the zoo, on Hugging Face models built from configs, and on a deliberately broken model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphkit.measure.gradient_check import compare_gradients
from graphkit.measure.verification import verify_split
from graphkit.models import zoo
from graphkit.models.specs import load_spec
from tests.specs.broken_split import WrongInWeightPhase

BROKEN = f"{Path(__file__).parent / 'specs' / 'broken_split.py'}:build"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_models_verify(name, dtype):
    module, inputs = zoo.build(name)
    report = verify_split(module, inputs, dtype=dtype)
    assert report.ok, report.table()
    assert report.params, "every zoo model has parameters"
    if name != "custom_function":
        assert report.flops["b"] + report.flops["w"] == report.flops["full"]


HF_SPECS = [
    "hf:gpt2",  # whole model: tied LM head, stage 0
    "hf:gpt2?stage=middle",
    "hf:llama?stage=middle",
    "hf:bert",
    "hf:mixtral?stage=middle",  # MoE
    "hf:t5",  # shared relative position bias and tied embeddings
]


@pytest.mark.parametrize("spec", HF_SPECS)
def test_transformers_models_verify_in_float64(spec):
    pytest.importorskip("transformers")
    module, inputs = load_spec(spec)
    report = verify_split(module, inputs, dtype=torch.float64)
    assert report.ok, report.table()
    assert report.flops["b"] + report.flops["w"] == report.flops["full"]
    statuses = {check.status for check in report.params}
    assert statuses == {"ok"}


def test_report_dict_has_the_documented_keys():
    module, inputs = zoo.build("mlp")
    data = verify_split(module, inputs).to_dict()
    assert {"ok", "inputs", "params", "flops", "groups"} <= set(data)
    assert set(data["flops"]) == {"full", "b", "w"}
    for entry in data["inputs"] + data["params"]:
        assert set(entry) == {"name", "status", "max_abs_error", "relative_error", "bitwise"}
    assert data["groups"] == 2


def test_a_wrong_weight_gradient_fails_and_names_the_parameter():
    module, inputs = load_spec(BROKEN)
    report = verify_split(module, inputs, dtype=torch.float64)
    assert not report.ok
    assert [check.name for check in report.failures] == ["weight"]
    assert report.failures[0].status == "wrong"
    assert report.failures[0].relative_error == pytest.approx(1.0)
    assert "FAILED" in report.table() and "weight" in report._repr_html_()


def test_verify_leaves_the_users_module_untouched():
    module, inputs = zoo.build("mlp")
    before = {name: parameter.detach().clone() for name, parameter in module.named_parameters()}
    verify_split(module, inputs, dtype=torch.float64)
    for name, parameter in module.named_parameters():
        assert parameter.grad is None and parameter.dtype == torch.float32
        assert torch.equal(parameter, before[name])


def test_verify_handles_activation_checkpointing_even_when_flops_cannot_be_counted():
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    torch.manual_seed(0)
    report = verify_split(Checkpointed(), (torch.randn(3, 4, requires_grad=True),), dtype=torch.float64)
    assert report.ok, report.table()
    assert report.flops["full"] > 0
    if report.flops["b"] < 0:  # PyTorch refused FlopCounterMode during the recomputation
        assert "not counted" in report.extra["flops_note"] and "not counted" in report.table()
    else:
        assert report.flops["b"] + report.flops["w"] >= report.flops["full"]


class _ComplexStage(torch.nn.Module):
    """``|x W|`` with a complex ``W``; the input is cast to ``W``'s dtype."""

    def __init__(self, dtype: torch.dtype = torch.complex64) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 3, dtype=dtype))

    def forward(self, x):
        return torch.tanh(x).to(self.weight.dtype) @ self.weight


class _ConjugatedInW(torch.autograd.Function):
    """``x * w`` whose weight gradient is conjugated in W only (graphkit asks for it alone there)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_weight = grad * x.conj()
        if not ctx.needs_input_grad[0]:
            grad_weight = grad_weight.conj()  # the deliberate bug: right real part, wrong imaginary part
        return grad * weight.conj() if ctx.needs_input_grad[0] else None, grad_weight


class _ConjugatedStage(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, dtype=torch.complex128))

    def forward(self, x):
        return _ConjugatedInW.apply(torch.tanh(x).to(torch.complex128), self.weight)


@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_complex_parameters_stay_complex_and_are_compared_as_complex(dtype):
    torch.manual_seed(0)
    module = _ComplexStage()
    report = verify_split(module, (torch.randn(2, 3, requires_grad=True),), dtype=dtype)
    assert report.ok, report.table()
    assert module.weight.dtype == torch.complex64 and module.weight.grad is None
    torch.manual_seed(0)
    report = verify_split(_ConjugatedStage(), (torch.randn(2, 3, requires_grad=True),))
    assert [check.name for check in report.failures] == ["weight"]
    gradient = torch.randn(3, dtype=torch.complex128)
    assert compare_gradients("weight", gradient, gradient.conj(), 1e-9).status == "wrong", (
        "not the real part alone"
    )


def test_a_pruned_module_with_tensor_hooks_verifies_and_keeps_its_hooks():
    from torch.nn.utils import prune

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    prune.l1_unstructured(module[0], "weight", 0.5)
    calls = []
    module[2].weight.register_hook(lambda grad: calls.append(1) or grad * 2)
    report = verify_split(module, (torch.randn(3, 4, requires_grad=True),), dtype=torch.float64)
    assert report.ok, report.table()
    assert {check.name for check in report.params} == {"0.bias", "0.weight_orig", "2.weight", "2.bias"}
    assert len(calls) == 2, "the hook ran in the reference and in the split"
    assert module[0].weight_orig.dtype == torch.float32 and module[0].weight_orig.grad is None


class _UnregisteredLeaf(torch.nn.Module):
    """A layer kept in a plain list: its parameters are leaves the outputs reach, but not registered."""

    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4).double()
        self.hidden = [torch.nn.Linear(4, 4).double()]
        self.broken = broken

    def forward(self, x):
        hidden = torch.tanh(self.first(x))
        weight = self.hidden[0].weight.t()
        return WrongInWeightPhase.apply(hidden, weight) if self.broken else hidden @ weight


@pytest.mark.parametrize("broken", [False, True])
def test_leaves_outside_the_module_are_compared_too(broken):
    torch.manual_seed(0)
    module = _UnregisteredLeaf(broken)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    report = verify_split(module, (x,))
    assert [check.name for check in report.params] == ["first.weight", "first.bias", "unregistered[0] (4, 4)"]
    assert [check.name for check in report.failures] == (["unregistered[0] (4, 4)"] if broken else [])
    assert module.hidden[0].weight.grad is None, "restored"


def test_a_forward_that_updates_buffers_verifies_and_the_buffers_are_restored():
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(4, 4)),
        torch.nn.Tanh(),
        torch.nn.BatchNorm1d(4),
        torch.nn.Dropout(0.3),
    )
    before = {name: value.clone() for name, value in module.state_dict().items()}
    report = verify_split(module, (torch.randn(5, 4, requires_grad=True),), dtype=torch.float64)
    assert report.ok, report.table()
    after = module.state_dict()
    for name, value in before.items():
        assert after[name].dtype == value.dtype and torch.equal(after[name], value), name


class ShrinksItsWeightInForward(torch.nn.Module):
    """A forward that changes a parameter in place (as ``nn.Embedding(max_norm=...)`` renormalizes rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        with torch.no_grad():
            self.linear.weight.mul_(0.5)
        return torch.tanh(self.linear(x))


@pytest.mark.parametrize("dtype", [None, torch.float64])
@pytest.mark.parametrize(
    "build",
    [ShrinksItsWeightInForward, lambda: torch.nn.Sequential(torch.nn.Embedding(6, 4, max_norm=0.5))],
    ids=["in-place update", "embedding max_norm"],
)
def test_a_forward_that_changes_parameters_in_place_verifies_and_the_parameters_are_restored(build, dtype):
    # both runs must start from the same weights (as from the same buffers), and the user gets theirs back
    torch.manual_seed(0)
    module = build().double()
    before = {name: value.clone() for name, value in module.state_dict().items()}
    inputs = (
        (torch.tensor([[1, 2, 5]]),)
        if isinstance(module, torch.nn.Sequential)
        else (torch.randn(5, 4, dtype=torch.float64, requires_grad=True),)
    )
    report = verify_split(module, inputs, dtype=dtype)
    assert report.ok, report.table()
    after = module.state_dict()
    for name, value in before.items():
        assert torch.equal(after[name], value), name


def test_verify_refuses_a_cuda_device_this_torch_cannot_use(monkeypatch):
    from graphkit.graph.tensors import GraphkitInputError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    module, inputs = zoo.build("mlp")
    with pytest.raises(GraphkitInputError, match="no CUDA device"):
        verify_split(module, inputs, device="cuda")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"dtype": "float64"}, "dtype must be a torch.dtype"),
        ({"autocast_dtype": "bfloat16"}, "autocast_dtype must be a torch.dtype"),
        ({"module": lambda x: x * 2}, "torch.nn.Module"),
    ],
)
def test_verify_says_what_is_wrong_with_a_dtype_name_or_a_function_instead_of_a_module(arguments, message):
    from graphkit.graph.tensors import GraphkitInputError

    call = {"module": torch.nn.Linear(3, 3), "inputs": (torch.randn(2, 3, requires_grad=True),), **arguments}
    with pytest.raises(GraphkitInputError, match=message):
        verify_split(call.pop("module"), call.pop("inputs"), **call)


class _LeafMadeInForward(torch.nn.Module):
    """As transformers' audio encoders: ``h = x[:, None]; h.requires_grad = True`` makes a new leaf in each
    forward, which the outputs reach besides the module's parameters."""

    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4).double()
        self.broken = broken

    def forward(self, x, features):
        made = features[:, :]  # a view of an input without grad: a leaf
        made.requires_grad = True
        hidden = torch.tanh(self.first(x))
        return WrongInWeightPhase.apply(hidden, made) if self.broken else hidden @ made


@pytest.mark.parametrize("broken", [False, True])
def test_a_leaf_the_forward_makes_is_compared_with_the_split_runs_own(broken):
    torch.manual_seed(0)
    x = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    report = verify_split(_LeafMadeInForward(broken), (x, torch.randn(4, 4, dtype=torch.float64)))
    assert [check.status for check in report.inputs] == ["ok"]
    assert [check.name for check in report.params] == ["first.weight", "first.bias", "unregistered[0] (4, 4)"]
    assert [check.status for check in report.params] == ["ok", "ok", "wrong" if broken else "ok"]
    if not broken:  # the split run's leaf got exactly a full backward's gradient
        assert report.params[2].max_abs_err == 0.0


class _DrawsFromNumpyAndRandom(torch.nn.Module):
    """Masks drawn from ``np.random`` (as Wav2Vec2's SpecAugment) and a scale from Python's ``random``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6).double()

    def forward(self, x):
        import random

        import numpy as np

        mask = torch.as_tensor(np.random.rand(6) > 0.5, dtype=x.dtype)
        return torch.tanh(self.linear(x)) * mask * (1 + random.random())


def test_a_forward_drawing_from_numpy_and_pythons_random_verifies_and_their_streams_go_on_undisturbed():
    import random

    np = pytest.importorskip("numpy")
    torch.manual_seed(0)
    module = _DrawsFromNumpyAndRandom()
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    np.random.seed(5)
    random.seed(5)
    torch.manual_seed(5)
    expected = (np.random.rand(), random.random(), torch.rand(1))  # the caller's next draws
    np.random.seed(5)
    random.seed(5)
    torch.manual_seed(5)
    report = verify_split(module, (x,))
    assert report.ok, report.table()
    assert {check.max_abs_err for check in [*report.inputs, *report.params]} == {0.0}
    assert (np.random.rand(), random.random(), torch.rand(1)) == expected


class _CountsItsCalls(torch.nn.Module):
    """A forward that depends on state changing from call to call: no seed makes two forwards agree."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3).double()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x) * self.calls


def test_two_forwards_that_differ_are_said_so_instead_of_reported_as_wrong_gradients():
    from graphkit.measure.verification import NondeterministicForwardError

    module = _CountsItsCalls()
    with pytest.raises(NondeterministicForwardError, match="different outputs in verify's two forwards"):
        verify_split(module, (torch.randn(2, 3, dtype=torch.float64, requires_grad=True),))
    assert all(parameter.grad is None for parameter in module.parameters()), "restored"


class _NaNGradient(torch.nn.Module):
    """sqrt at 0 has an infinite derivative, times the 0 that made it: the full backward gives NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(3, 3).double()
        self.second = torch.nn.Linear(3, 3).double()

    def forward(self, x):
        return self.second(torch.tanh(self.first(x))) + torch.sqrt(self.first(x) * 0)


def test_nan_gradients_of_the_full_backward_are_compared_by_place_not_reported_as_wrong():
    torch.manual_seed(0)
    module = _NaNGradient()
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    reference = _NaNGradient()
    reference.load_state_dict(module.state_dict())
    reference(x.detach()).sum().backward()
    assert reference.first.weight.grad.isnan().all() and not reference.second.weight.grad.isnan().any()
    report = verify_split(module, (x,))
    assert report.ok, report.table()
    assert report.extra["nonfinite"] == ["0", "first.weight", "first.bias"]  # the input's gradient too
    assert "NaN or inf in the full backward's gradients too" in report.table()


@pytest.mark.parametrize(
    ("reference", "split", "status"),
    [
        ([float("nan"), 1.0], [float("nan"), 1.0], "ok"),
        ([float("nan"), 1.0], [1.0, 1.0], "wrong"),  # a NaN the split lost
        ([1.0, 1.0], [float("nan"), 1.0], "wrong"),  # a NaN the split made
        ([float("inf"), 1.0], [float("-inf"), 1.0], "wrong"),
        ([float("nan"), 1.0], [float("nan"), 2.0], "wrong"),  # the finite rest still compared
    ],
)
def test_non_finite_values_compare_by_place_and_the_finite_rest_by_value(reference, split, status):
    check = compare_gradients("g", torch.tensor(reference), torch.tensor(split), 1e-9)
    assert check.status == status
