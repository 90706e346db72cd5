"""The ``compile=`` key of pipeline specs: compile each stage's blocks, as torchtitan compiles its blocks.

``zoo-pipeline:mlp?compile=split`` or ``hf:gpt2?n_layer=4&compile=split-eager`` builds the pipeline as without
the key, then compiles, in every stage, each block of its repeated blocks (the children of each
``nn.ModuleList`` it holds: GPT-2's ``h``, Llama's ``layers``), or the whole stage when it has none (a
``zoo-pipeline`` MLP stage), with ``nn.Module.compile`` - in place, so that parameter names stay as they
were. A block whose class is one of PyTorch's own (``nn.Sequential``, ``nn.TransformerEncoderLayer``) gets
its ``forward`` compiled instead, also in place: ``nn.Module.compile`` wraps ``Module._call_impl``, a frame
in ``torch/nn`` that dynamo skips together with the ``torch.nn`` forwards it calls, so such a block would
run eager without a word. The values (:data:`COMPILE_VALUES`):

- ``split``: graphkit's splitting backend with inductor (``graphkit.splitting_backend()``): each block's
  backward runs as a compiled I and a compiled W;
- ``split-eager``: the same with ``"aot_eager"`` (bit for bit the blocks' full backward);
- ``inductor`` and ``aot_eager``: torch.compile's own backends (the block's backward runs once, in I), to
  compare against.

The splitting backends live in the split layer, above this one: :mod:`graphkit.split.compile_backend`
registers them here (:func:`register_compile_backend`) when ``graphkit`` is imported.
"""

from __future__ import annotations

import torch
from torch import nn

from graphkit.models.specs import SpecError

__all__ = ["COMPILE_BACKENDS", "COMPILE_KEY", "COMPILE_VALUES", "compile_blocks", "split_compile_key"]

COMPILE_KEY = "compile"

COMPILE_BACKENDS = {
    "split": "graphkit_split",
    "split-eager": "graphkit_split_eager",
    "inductor": "inductor",
    "aot_eager": "aot_eager",
}
"""The dynamo backend name of each ``compile=`` value."""

COMPILE_VALUES = tuple(COMPILE_BACKENDS)
"""What ``compile=`` takes (module docstring)."""


def split_compile_key(spec: str) -> tuple[str, str | None]:
    """``(spec without its compile= key, the key's value or None)`` of an ``hf:`` or ``zoo-pipeline:`` spec.

    Raises:
        SpecError: ``compile=`` is given twice or with a value not in :data:`COMPILE_VALUES`.
    """
    head, question, query = spec.partition("?")
    if not question:
        return spec, None
    kept, value = [], None
    for piece in query.split("&"):
        key, _, given = (part.strip() for part in piece.partition("="))
        if key != COMPILE_KEY:
            kept.append(piece)
            continue
        if value is not None:
            raise SpecError(f"pipeline spec {spec!r}: compile= is given twice")
        if given not in COMPILE_VALUES:
            raise SpecError(
                f"pipeline spec {spec!r}: compile={given!r}; it takes one of {', '.join(COMPILE_VALUES)}"
            )
        value = given
    rest = "&".join(kept)
    return (f"{head}?{rest}" if rest else head), value


def compile_blocks(stages: list[nn.Module], value: str) -> None:
    """Compile, in place, each block of each stage (module docstring) with the backend of ``value``.

    Raises:
        SpecError: ``value`` is not in :data:`COMPILE_VALUES`, or dynamo does not know its backend (graphkit
            run from a source tree without ``graphkit.split.compile_backend.register_backends()``).
    """
    if value not in COMPILE_VALUES:
        raise SpecError(f"compile={value!r}: it takes one of {', '.join(COMPILE_VALUES)}")
    from torch._dynamo import list_backends

    backend = COMPILE_BACKENDS[value]
    if backend not in list_backends(exclude_tags=()):
        raise SpecError(
            f"compile={value}: dynamo knows no backend {backend!r}; install graphkit (it declares it as an "
            "entry point) or call graphkit.split.compile_backend.register_backends() first"
        )
    for stage in stages:
        lists = [module for module in stage.modules() if isinstance(module, nn.ModuleList)]
        blocks = [block for module_list in lists for block in module_list] or [stage]
        for block in blocks:
            if type(block).forward.__module__.startswith("torch.nn."):
                # dynamo skips Module._call_impl's frame and the torch.nn forward under it (module docstring)
                block.forward = torch.compile(block.forward, backend=backend)
            else:
                block.compile(backend=backend)
