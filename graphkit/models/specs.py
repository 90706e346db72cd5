"""Model specs: one string that names a model and the inputs of one forward call.

A *spec* tells graphkit's commands and notebooks which model to look at. Four forms are understood:

``zoo:NAME``
    A built-in model from :mod:`graphkit.models.zoo`, e.g. ``zoo:gpt``.
``path/to/file.py:function``
    A function in a Python file. The file is imported as a fresh module (its folder is on ``sys.path``
    while it is imported and while the function runs, so it can import files next to it).
``package.module:function``
    A function in an importable module, e.g. ``my_project.models:make_stage``.
``hf:ARCH[?key=value&...]``
    A Hugging Face ``transformers`` model built from a small config with random weights, handled by
    ``graphkit.models.huggingface.load_hf_spec`` (extra ``models``).

The function takes no arguments and returns ``(module, inputs)``: an ``nn.Module`` and either a tuple of
positional arguments or a dict of keyword arguments for ``module(...)``. Input tensors with
``requires_grad=True`` are the stage inputs. Every mistake raises :class:`SpecError`, whose message says what
was wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from graphkit.models import zoo
from graphkit.models.devices import checked_device

__all__ = [
    "SpecError",
    "check_model_result",
    "import_spec_file",
    "import_spec_module",
    "load_spec",
    "load_spec_on",
    "looks_like_path",
    "meta_forward_error",
    "missing_function_error",
    "on_sys_path",
    "meta_graph_note",
    "model_frame",
    "required_arguments",
    "spec_inputs_as_call",
]

_FORMS = "zoo:NAME, path/to/file.py:function, package.module:function or hf:ARCH"


class SpecError(ValueError):
    """A model spec could not be turned into ``(module, inputs)``; the message says why and how to fix it."""


def load_spec(spec: str) -> tuple[nn.Module, tuple[Any, ...] | dict[str, Any]]:
    """Build the model a spec names and return ``(module, inputs)``.

    Args:
        spec: ``zoo:NAME``, ``path/to/file.py:function``, ``package.module:function`` or
            ``hf:ARCH[?key=value&...]`` (see the module docstring).

    Returns:
        ``(module, inputs)`` where ``inputs`` is a tuple of positional arguments or a dict of keyword
        arguments (a list returned by a spec function becomes a tuple).

    Raises:
        SpecError: the spec is malformed; the zoo has no such model; the file does not exist; the module
            cannot be imported; the function is missing, needs arguments, raises, or returns something other
            than ``(nn.Module, tuple | dict)``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"a model spec must be a non-empty string such as {_FORMS}; got {spec!r}")
    spec = spec.strip()
    if spec.startswith("zoo:"):
        return _load_zoo(spec, spec[len("zoo:") :])
    if spec.startswith("hf:"):
        return _load_hf(spec)

    target, colon, function_name = spec.rpartition(":")
    if not colon or not target or not function_name:
        raise SpecError(
            f"model spec {spec!r} names no function: write it as {_FORMS} "
            "(the function takes no arguments and returns (module, inputs))"
        )
    if looks_like_path(target):
        module = import_spec_file(spec, Path(target))
        with on_sys_path(Path(target).resolve().parent):
            return _call_spec_function(spec, module, function_name)
    module = import_spec_module(spec, target)
    return _call_spec_function(spec, module, function_name)


def load_spec_on(spec: str, device: str | None = None) -> tuple[nn.Module, tuple[Any, ...] | dict[str, Any]]:
    """:func:`load_spec`, with the module and its input tensors on ``device`` (None: where the spec puts them).

    ``device="meta"`` builds the model *on* the meta device (under ``with torch.device("meta")``): its
    parameters and inputs have shapes and dtypes but no memory and no values, so a stage of any size
    loads in seconds and the autograd graph, parameter groups, saved bytes and FLOPs follow from shapes
    alone (torchview's ``device='meta'`` idea). Anything that needs values (verifying gradients) cannot
    run there. Other devices build on the CPU, then move the module and every input tensor.

    Raises:
        SpecError: as :func:`load_spec`; the device name is unknown; the spec reads values while it is
            built (``.item()``, data-dependent shapes), which the meta device cannot give.
    """
    import torch

    if device is None:
        return load_spec(spec)
    target = checked_device(device, SpecError)
    if target.type == "meta":
        try:
            with torch.device("meta"):
                return load_spec(spec)
        except SpecError as error:
            if "meta tensors" in str(error) or "meta" in str(error.__cause__ or ""):
                raise SpecError(
                    f"spec {spec!r} cannot be built on the meta device: it reads tensor values while it is "
                    f"built ({error.__cause__ or error}); run it on cpu"
                ) from error
            raise
    module, inputs = load_spec(spec)

    def moved(value: Any) -> Any:  # depth bounded by the nesting of the spec's inputs
        if isinstance(value, torch.Tensor):
            return value.detach().to(target).requires_grad_(value.requires_grad)
        if isinstance(value, Mapping):
            return {key: moved(item) for key, item in value.items()}
        if isinstance(value, tuple | list):
            return type(value)(moved(item) for item in value)
        return value

    return module.to(target), moved(inputs)


def meta_forward_error(spec: str, error: BaseException) -> SpecError | None:
    """The clear error for a forward on the meta device that read tensor values, else None.

    ``error`` is what the forward raised; PyTorch says "... cannot be called on meta tensors" (``.item()``,
    data-dependent control flow: the whole Hugging Face models look for packed sequences that way).
    """
    if "meta tensor" not in str(error):
        return None
    return SpecError(
        f"the forward of {spec!r} reads tensor values ({error}), which the meta device does not have: "
        "--device meta works for models whose forward depends on shapes alone (hf:ARCH?stage=middle, "
        "the zoo); run this one on cpu, with a smaller config if it is too large"
    )


def meta_graph_note(module: nn.Module) -> str:
    """Why the graph of ``module`` on the ``meta`` device differs from the one on cpu or cuda ("" when it
    does not): PyTorch has no fused kernel for ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` on the meta device and
    runs them a time step at a time (addmm, sigmoid, tanh ... per step and layer), where the CPU runs one
    ``mkldnn_rnn_layer`` (cuDNN on CUDA) per layer: more nodes, the same parameters, and groups that can
    differ (the fused node gives one group per layer; step by step, each weight has its own addmm)."""
    recurrent = sorted({type(child).__name__ for child in module.modules() if isinstance(child, nn.RNNBase)})
    if not recurrent:
        return ""
    return (
        f"on the meta device PyTorch runs {', '.join(recurrent)} a time step at a time (it has no fused meta "
        "kernel), so this graph has more nodes than the one on cpu, where one fused node (mkldnn_rnn_layer; "
        "cuDNN on cuda) per layer does the work; the parameters are the same, the groups can differ (step by "
        "step, each weight leaves the input path at its own addmm)"
    )


def model_frame(error: BaseException) -> traceback.FrameSummary | None:
    """Where the user's model raised ``error``, or None when graphkit raised it.

    The deepest frame of its traceback outside PyTorch and the standard library (and the
    ``__torch_function__`` / ``__torch_dispatch__`` handlers that run each op of the model under graphkit's
    modes), when that frame is not graphkit's own (a spec's file, its module, ``transformers``). When the
    frames below the deepest graphkit frame are all PyTorch's and one of them is a module call
    (``nn.Module.__call__``), a module of PyTorch's that the model is built from raised it
    (``nn.Sequential(nn.Linear(5, 4), nn.Linear(5, 4))``: "mat1 and mat2 shapes cannot be multiplied"):
    that is the model's error too, and the frame is the deepest one, in PyTorch. None when graphkit raised
    it (a frame of graphkit is the deepest one left, with no module call below it).

    The commands use it to tell a mistake in the user's model (one line, exit status 2) from a bug in
    graphkit (a traceback). An error raised from another (``raise ... from error``) is looked up by its
    cause when its own traceback ends in graphkit.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        deepest: traceback.FrameSummary | None = None
        for frame in reversed(traceback.extract_tb(current.__traceback__)):
            if frame.filename.startswith("<"):  # generated code (a dataclass's __setattr__, <frozen ...>)
                continue
            where = Path(frame.filename).resolve()
            if _within(where, _TORCH) or _in_stdlib(where):
                deepest = deepest or frame
                if _is_module_call(frame, where):
                    return deepest  # a module of PyTorch's in the model raised, nothing of graphkit below
                continue
            if frame.name in _PASS_THROUGH:  # a mode's handler that runs the model's op (graphkit's tracing)
                continue
            if _within(where, _GRAPHKIT):
                break  # graphkit's deepest: look at the cause, if any
            return frame
        current = current.__cause__
    return None


def _is_module_call(frame: traceback.FrameSummary, where: Path) -> bool:
    """Whether ``frame`` is ``torch.nn.Module.__call__`` running a module (``_call_impl``)."""
    return frame.name in _MODULE_CALLS and where == _MODULE_FILE


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _in_stdlib(path: Path) -> bool:
    return _within(path, _STDLIB) and not {"site-packages", "dist-packages"} & set(path.parts)


_GRAPHKIT = Path(__file__).resolve().parents[1]
_PASS_THROUGH = {"__torch_function__", "__torch_dispatch__"}
_TORCH = Path(nn.__file__).resolve().parents[1]
_MODULE_FILE = Path(nn.Module.__call__.__code__.co_filename).resolve()
_MODULE_CALLS = {"_call_impl", "_wrapped_call_impl"}
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def spec_inputs_as_call(
    inputs: tuple[Any, ...] | list[Any] | Mapping[str, Any],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Turn the ``inputs`` of a spec into ``(args, kwargs)`` for ``module(*args, **kwargs)``.

    A tuple or list gives ``(tuple(inputs), {})``; a mapping gives ``((), dict(inputs))``.

    Raises:
        SpecError: ``inputs`` is neither a tuple/list nor a mapping with string keys.
    """
    if isinstance(inputs, tuple | list):
        return tuple(inputs), {}
    if isinstance(inputs, Mapping):
        bad_keys = [key for key in inputs if not isinstance(key, str)]
        if bad_keys:
            raise SpecError(f"keyword inputs must have string keys; got {bad_keys!r}")
        return (), dict(inputs)
    raise SpecError(
        f"inputs must be a tuple of positional arguments or a dict of keyword arguments; "
        f"got {type(inputs).__name__} (wrap a single tensor as (x,))"
    )


# --------------------------------------------------------------------------------------------------------
# The four forms


def _load_zoo(spec: str, name: str) -> tuple[nn.Module, tuple[Any, ...] | dict[str, Any]]:
    if name not in zoo.MODELS:
        known = ", ".join(zoo.MODELS)
        raise SpecError(f"unknown zoo model {name!r} in spec {spec!r}; known models: {known} (e.g. zoo:gpt)")
    return check_model_result(spec, f"zoo.{name}", zoo.MODELS[name].build())


def _load_hf(spec: str) -> tuple[nn.Module, tuple[Any, ...] | dict[str, Any]]:
    try:
        hf = importlib.import_module("graphkit.models.huggingface")
    except ModuleNotFoundError as error:
        if error.name != "graphkit.models.huggingface":
            raise
        raise SpecError(
            f"spec {spec!r} needs graphkit.models.huggingface, which this installation of graphkit does not have; "
            "use a zoo: or file spec instead"
        ) from error
    result = hf.load_hf_spec(spec)
    return check_model_result(spec, "graphkit.models.huggingface.load_hf_spec", result)


def looks_like_path(target: str) -> bool:
    """True when the part before ``:function`` is a file path rather than a dotted module name."""
    return target.endswith(".py") or "/" in target or "\\" in target


def import_spec_file(spec: str, path: Path, *, kind: str = "model spec") -> ModuleType:
    """Import the Python file ``path`` that ``spec`` names, as a module of its own.

    ``kind`` is how the messages name the spec: ``"model spec"``, ``"pipeline spec"``, or ``"spec"`` where
    either may be meant.

    Raises:
        SpecError: the file does not exist, is a folder, or raises while it is imported.
    """
    if not path.is_file():
        where = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise SpecError(
            f"{kind} {spec!r}: the file {str(path)!r} {where} (relative to {str(Path.cwd())!r}); "
            "give the path of a .py file, then ':' and the function name"
        )
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    module_name = f"graphkit_spec_{_identifier(resolved.stem)}_{digest}"
    import_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if import_spec is None or import_spec.loader is None:
        raise SpecError(f"{kind} {spec!r}: {str(path)!r} cannot be imported as Python; is it a .py file?")
    module = importlib.util.module_from_spec(import_spec)
    sys.modules[module_name] = module
    try:
        with on_sys_path(resolved.parent):
            import_spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise SpecError(
            f"{kind} {spec!r}: importing {str(path)!r} failed with "
            f"{type(error).__name__}: {error}; fix the file so that `python {path}` runs"
        ) from error
    return module


def import_spec_module(spec: str, module_name: str, *, kind: str = "model spec") -> ModuleType:
    """Import the module ``module_name`` that ``spec`` names (``kind`` as :func:`import_spec_file`).

    Raises:
        SpecError: the module cannot be imported (the message says why and how to fix it).
    """
    try:
        return importlib.import_module(module_name)
    except Exception as error:
        hint = (
            "check the module name and that its package is installed or on PYTHONPATH; "
            "for a file, write path/to/file.py:function"
        )
        raise SpecError(
            f"{kind} {spec!r}: importing module {module_name!r} failed with "
            f"{type(error).__name__}: {error}; {hint}"
        ) from error


def _call_spec_function(
    spec: str, module: ModuleType, function_name: str
) -> tuple[nn.Module, tuple[Any, ...] | dict[str, Any]]:
    where = getattr(module, "__file__", None) or module.__name__
    function = getattr(module, function_name, None)
    if function is None:
        raise missing_function_error("model spec", spec, module, function_name)
    if not callable(function):
        raise SpecError(
            f"model spec {spec!r}: {function_name!r} in {where!s} is a {type(function).__name__}, "
            "not a function; point the spec at a function that returns (module, inputs)"
        )
    _check_takes_no_arguments(spec, function_name, function)
    try:
        result = function()
    except Exception as error:
        raise SpecError(
            f"model spec {spec!r}: calling {function_name}() raised {type(error).__name__}: {error}"
        ) from error
    return check_model_result(spec, f"{function_name}()", result)


def required_arguments(function: Callable[..., Any], given: tuple[str, ...] = ()) -> list[str]:
    """The parameters of ``function`` a call must pass but for ``given`` (no default, not ``*args`` or
    ``**kwargs``); none when its signature cannot be read (a builtin)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return []
    return [
        name
        for name, parameter in parameters.items()
        if name not in given
        and parameter.default is inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


def _check_takes_no_arguments(spec: str, function_name: str, function: Callable[..., Any]) -> None:
    required = required_arguments(function)
    if required:
        raise SpecError(
            f"model spec {spec!r}: {function_name}() requires arguments {required!r}; "
            "a spec function takes no arguments (give them defaults, "
            "or wrap the call in a function without parameters)"
        )


def check_model_result(
    spec: str, producer: str, result: Any
) -> tuple[nn.Module, tuple[Any, ...] | dict[str, Any]]:
    """``result`` of a spec's function (``producer`` names it in messages) as ``(module, inputs)``.

    Raises:
        SpecError: ``result`` is not a pair of an ``nn.Module`` and a tuple or dict of inputs.
    """
    shape_hint = "return (module, inputs) with module an nn.Module and inputs a tuple or a dict"
    if not isinstance(result, tuple | list) or len(result) != 2:
        got = f"a {type(result).__name__}"
        if isinstance(result, tuple | list):
            got += f" of length {len(result)}"
        raise SpecError(f"model spec {spec!r}: {producer} returned {got}; {shape_hint}")
    module, inputs = result
    if not isinstance(module, nn.Module):
        raise SpecError(
            f"model spec {spec!r}: {producer} returned {type(module).__name__} as the module; {shape_hint}"
        )
    try:
        args, kwargs = spec_inputs_as_call(inputs)
    except SpecError as error:
        raise SpecError(
            f"model spec {spec!r}: {producer} returned bad inputs: {error}; {shape_hint}"
        ) from None
    return module, (kwargs if isinstance(inputs, Mapping) else args)


# --------------------------------------------------------------------------------------------------------
# Helpers


def _identifier(text: str) -> str:
    return "".join(character if character.isalnum() else "_" for character in text) or "module"


def missing_function_error(kind: str, spec: str, module: ModuleType, function_name: str) -> SpecError:
    """The error for a spec whose file or module has no ``function_name``.

    It names the file as the spec wrote it (or the module), lists the public functions and classes the
    module defines itself (not those it imports), and suggests the closest name (:func:`difflib.get_close_matches`)
    when there is one, e.g. ``my_model.py has no function 'mkae'; did you mean 'make'? it defines: make, Block``.

    Args:
        kind: how to name the spec: ``"model spec"``, ``"pipeline spec"`` or ``"spec"``.
        spec: the spec as given, ``target:function``.
        module: the module imported from the spec's file or module name.
        function_name: the name after the last ``:``.
    """
    target = spec.strip().rpartition(":")[0]
    where = Path(target).name if looks_like_path(target) else target
    defined = _public_callables(module)
    close = difflib.get_close_matches(function_name, defined, n=1)
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    listed = f"it defines: {', '.join(defined)}" if defined else "it defines no public function"
    return SpecError(f"{kind} {spec!r}: {where} has no function {function_name!r}; {suggestion}{listed}")


def _public_callables(module: ModuleType) -> list[str]:
    """The public functions and classes ``module`` defines itself, in the order it defines them."""
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and getattr(value, "__module__", None) == module.__name__
    ]


@contextmanager
def on_sys_path(folder: Path) -> Iterator[None]:
    """Put ``folder`` first on ``sys.path`` for the duration of the block (unless it is already there)."""
    entry = str(folder)
    if entry in sys.path:
        yield
        return
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with suppress(ValueError):
            sys.path.remove(entry)
