"""Model specs: every form loads, every mistake gets an error that says what was wrong and how to fix it."""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from graphkit.models import zoo
from graphkit.models.specs import SpecError, load_spec, spec_inputs_as_call

GOOD_FILE = """
import torch
from torch import nn

def make():
    torch.manual_seed(3)
    return nn.Linear(4, 2), (torch.randn(5, 4, requires_grad=True),)

def make_kwargs():
    return nn.Linear(4, 2), {"input": torch.ones(1, 4)}

def make_list():
    return [nn.Identity(), [torch.ones(2)]]

def needs_argument(width):
    return nn.Linear(width, 2), (torch.ones(1, width),)

def with_default(width=3):
    return nn.Linear(width, 2), (torch.ones(1, width),)

def raises():
    raise RuntimeError("out of tiny tensors")

def returns_module_only():
    return nn.Linear(4, 2)

def returns_three():
    return nn.Linear(4, 2), (torch.ones(1, 4),), "extra"

def returns_no_module():
    return "linear", (torch.ones(1, 4),)

def returns_bare_tensor():
    return nn.Linear(4, 2), torch.ones(1, 4)

def returns_int_keys():
    return nn.Linear(4, 2), {0: torch.ones(1, 4)}

NOT_A_FUNCTION = 42
"""


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_models.py"
    path.write_text(GOOD_FILE)
    return path


def test_zoo_spec_builds_the_zoo_model() -> None:
    module, inputs = load_spec("zoo:gpt")
    expected_module, expected_inputs = zoo.gpt()
    assert type(module) is type(expected_module)
    assert isinstance(inputs, tuple) and len(inputs) == 1
    assert torch.equal(inputs[0], expected_inputs[0])
    torch.testing.assert_close(module(*inputs), expected_module(*expected_inputs))


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_every_zoo_model_loads_by_spec(name: str) -> None:
    module, inputs = load_spec(f"zoo:{name}")
    assert isinstance(module, nn.Module)
    assert isinstance(inputs, tuple | dict)


def test_unknown_zoo_name_lists_the_known_names() -> None:
    with pytest.raises(SpecError) as caught:
        load_spec("zoo:gtp")
    message = str(caught.value)
    assert "unknown zoo model 'gtp'" in message
    for name in ("gpt", "gpt_stage", "mlp", "lstm", "conv_bn"):
        assert name in message


def test_file_spec_calls_the_function(spec_file: Path) -> None:
    module, inputs = load_spec(f"{spec_file}:make")
    assert isinstance(module, nn.Linear) and module.in_features == 4
    (x,) = inputs
    assert x.shape == (5, 4) and x.requires_grad
    torch.manual_seed(3)
    expected_weight = nn.Linear(4, 2).weight
    torch.testing.assert_close(module.weight, expected_weight)


def test_file_spec_with_a_relative_path(spec_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(spec_file.parent)
    module, _ = load_spec("my_models.py:make")
    assert isinstance(module, nn.Linear)


def test_file_spec_keyword_inputs_list_inputs_and_defaults(spec_file: Path) -> None:
    module, inputs = load_spec(f"{spec_file}:make_kwargs")
    assert isinstance(inputs, dict) and set(inputs) == {"input"}
    assert module(**inputs).shape == (1, 2)

    module, inputs = load_spec(f"{spec_file}:make_list")
    assert isinstance(module, nn.Identity)
    assert isinstance(inputs, tuple) and len(inputs) == 1

    module, inputs = load_spec(f"{spec_file}:with_default")
    assert module.in_features == 3


def test_file_spec_can_import_a_file_next_to_it(tmp_path: Path) -> None:
    (tmp_path / "helper_layers_for_spec.py").write_text("WIDTH = 6\n")
    (tmp_path / "entry.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            import helper_layers_for_spec

            def make():
                width = helper_layers_for_spec.WIDTH
                return nn.Linear(width, 1), (torch.ones(2, width),)
            """
        )
    )
    path_before = list(sys.path)
    try:
        module, _ = load_spec(f"{tmp_path / 'entry.py'}:make")
    finally:
        sys.modules.pop("helper_layers_for_spec", None)
    assert module.in_features == 6
    assert sys.path == path_before, "the file's folder is taken off sys.path again"


def test_module_spec_imports_a_dotted_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "spec_test_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(GOOD_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module, inputs = load_spec("spec_test_package.models:make")
    finally:
        for name in ("spec_test_package.models", "spec_test_package"):
            sys.modules.pop(name, None)
    assert isinstance(module, nn.Linear) and inputs[0].shape == (5, 4)

    module, inputs = load_spec("graphkit.models.zoo:mlp")
    assert isinstance(module, nn.Sequential) and inputs[0].shape == (4, 16)


def test_hf_spec_is_delegated_to_graphkit_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[str] = []

    def load_hf_spec(spec: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
        received.append(spec)
        return nn.Linear(2, 2), {"input": torch.ones(1, 2)}

    fake = types.ModuleType("graphkit.models.huggingface")
    fake.load_hf_spec = load_hf_spec  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "graphkit.models.huggingface", fake)
    module, inputs = load_spec("hf:gpt2?n_layer=2")
    assert received == ["hf:gpt2?n_layer=2"]
    assert isinstance(module, nn.Linear) and set(inputs) == {"input"}


def test_hf_spec_without_graphkit_hf_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "graphkit.models.huggingface", None)
    with pytest.raises(SpecError, match="needs graphkit.models.huggingface"):
        load_spec("hf:gpt2")


def test_hf_spec_with_a_wrong_return_shape_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("graphkit.models.huggingface")
    fake.load_hf_spec = lambda spec: nn.Linear(2, 2)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "graphkit.models.huggingface", fake)
    with pytest.raises(SpecError, match=r"returned a Linear; return \(module, inputs\)"):
        load_spec("hf:gpt2")


# --------------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("spec", ["", "   ", "zoo_gpt", "my_models.py", "pkg.module:", ":make"])
def test_malformed_spec_shows_the_forms(spec: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    message = str(caught.value)
    assert (
        "zoo:NAME" in message
        and "path/to/file.py:function" in message
        and "package.module:function" in message
    )


def test_non_string_spec_is_rejected() -> None:
    with pytest.raises(SpecError, match="non-empty string"):
        load_spec(None)  # type: ignore[arg-type]


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.py"
    with pytest.raises(SpecError) as caught:
        load_spec(f"{missing}:make")
    message = str(caught.value)
    assert str(missing) in message and "does not exist" in message and ".py file" in message


def test_missing_function_names_the_file_and_its_functions(tmp_path: Path) -> None:
    path = tmp_path / "my_transformer.py"
    path.write_text(
        "import torch\nfrom torch import nn\nfrom math import sqrt\n\n\n"
        "def make():\n    return nn.Linear(2, 2), (torch.zeros(1, 2),)\n\n\n"
        "class Block(nn.Module):\n    pass\n\n\n"
        "def _helper():\n    pass\n"
    )
    with pytest.raises(SpecError) as caught:
        load_spec(f"{path}:mkae")
    message = str(caught.value)
    assert message.startswith(f"model spec '{path}:mkae': ")
    assert "my_transformer.py has no function 'mkae'; did you mean 'make'? it defines: make, Block" in message
    assert "graphkit_spec_" not in message and "sqrt" not in message and "_helper" not in message
    with pytest.raises(SpecError) as caught:
        load_spec(f"{path}:build_everything")
    assert "did you mean" not in str(caught.value)
    assert str(caught.value).endswith("has no function 'build_everything'; it defines: make, Block")


def test_folder_instead_of_file(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    with pytest.raises(SpecError, match="is a folder, not a file"):
        load_spec(f"{folder}/:make")


def test_file_that_fails_to_import_includes_the_original_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise ImportError('missing_dependency_xyz is not installed')\n")
    with pytest.raises(SpecError) as caught:
        load_spec(f"{broken}:make")
    message = str(caught.value)
    assert "importing" in message and "ImportError: missing_dependency_xyz is not installed" in message
    assert isinstance(caught.value.__cause__, ImportError)
    imported_files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    assert str(broken.resolve()) not in imported_files, "a failed import leaves no module behind"


def test_file_with_a_syntax_error(tmp_path: Path) -> None:
    broken = tmp_path / "syntax.py"
    broken.write_text("def make(:\n")
    with pytest.raises(SpecError, match="SyntaxError"):
        load_spec(f"{broken}:make")


def test_module_that_cannot_be_imported_includes_the_original_error() -> None:
    with pytest.raises(SpecError) as caught:
        load_spec("no_such_package_for_graphkit.models:make")
    message = str(caught.value)
    assert "importing module 'no_such_package_for_graphkit.models' failed" in message
    assert "No module named 'no_such_package_for_graphkit'" in message
    assert "PYTHONPATH" in message
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_missing_function_lists_the_functions_the_file_defines(spec_file: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(f"{spec_file}:build_model")
    message = str(caught.value)
    assert "no function 'build_model'" in message
    assert "make, make_kwargs, make_list" in message
    assert "NOT_A_FUNCTION" not in message and "torch" not in message.split("defines:")[1]


def test_attribute_that_is_not_a_function(spec_file: Path) -> None:
    with pytest.raises(SpecError, match="'NOT_A_FUNCTION' .* is a int, not a function"):
        load_spec(f"{spec_file}:NOT_A_FUNCTION")


def test_function_that_needs_arguments(spec_file: Path) -> None:
    with pytest.raises(
        SpecError, match=r"needs_argument\(\) requires arguments \['width'\]; a spec function takes no"
    ):
        load_spec(f"{spec_file}:needs_argument")


def test_function_that_raises_includes_the_error(spec_file: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(f"{spec_file}:raises")
    assert "calling raises() raised RuntimeError: out of tiny tensors" in str(caught.value)
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        ("returns_module_only", "returned a Linear;"),
        ("returns_three", "returned a tuple of length 3;"),
        ("returns_no_module", "returned str as the module;"),
        ("returns_bare_tensor", r"got Tensor \(wrap a single tensor as \(x,\)\)"),
        ("returns_int_keys", r"string keys; got \[0\]"),
    ],
)
def test_wrong_return_shape(spec_file: Path, function: str, expected: str) -> None:
    with pytest.raises(SpecError, match=expected) as caught:
        load_spec(f"{spec_file}:{function}")
    assert "return (module, inputs) with module an nn.Module and inputs a tuple or a dict" in str(
        caught.value
    )


def test_spec_error_is_a_value_error() -> None:
    assert issubclass(SpecError, ValueError)


# --------------------------------------------------------------------------------------------------------
# spec_inputs_as_call


def test_spec_inputs_as_call() -> None:
    x = torch.ones(2)
    assert spec_inputs_as_call((x, 3)) == ((x, 3), {})
    assert spec_inputs_as_call([x]) == ((x,), {})
    assert spec_inputs_as_call({"input_ids": x}) == ((), {"input_ids": x})
    assert spec_inputs_as_call(()) == ((), {})
    with pytest.raises(SpecError, match="wrap a single tensor"):
        spec_inputs_as_call(x)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="string keys"):
        spec_inputs_as_call({1: x})  # type: ignore[dict-item]
