"""Models to look at: the built-in zoo, small Hugging Face models and model specs.

- :mod:`graphkit.models.zoo`: small built-in models, each one graph pattern (``zoo:NAME``);
- :mod:`graphkit.models.huggingface`: ``transformers`` models from small configs, random weights
  (``hf:ARCH?key=value``, extra ``models``);
- :mod:`graphkit.models.specs`: :func:`load_spec`, which turns a spec string into ``(module, inputs)``;
- :mod:`graphkit.models.devices`: :func:`~graphkit.models.devices.checked_device`, a device name checked
  before anything runs there;
- :mod:`graphkit.models.pipeline_specs`: pipeline specs, one format for every pipeline command
  (``verify-pipeline``, ``costs``, ``timeline``, ``compare-schedules``): a function of ``num_stages`` and
  ``batch_size`` returning ``(stages, loss_fn, inputs, target)`` for the whole batch, the built-in
  ``zoo-pipeline:NAME`` and ``hf:gpt2`` / ``hf:llama`` cut into stages;
- :mod:`graphkit.models.huggingface_stages`: the stage modules, key parsing and layer split of the
  ``hf:gpt2`` and ``hf:llama`` pipeline specs.

Models sit beside the graph layer at the bottom: they import nothing else of graphkit.
"""

from __future__ import annotations

from graphkit.models.specs import SpecError, load_spec, spec_inputs_as_call

__all__ = ["SpecError", "load_spec", "spec_inputs_as_call"]
