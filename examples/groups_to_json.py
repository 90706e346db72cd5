"""Write the parameter groups of a model as JSON: parameters, intermediates, flags, unused parameters.

    .venv/bin/python examples/groups_to_json.py                          # zoo:gpt_stage, to standard output
    .venv/bin/python examples/groups_to_json.py 'hf:llama?stage=middle' -o llama_groups.json
    .venv/bin/python examples/groups_to_json.py my_model.py:make_stage

The argument is a model spec (``zoo:NAME``, ``path/to/file.py:function``, ``package.module:function``,
``hf:ARCH?key=value``). Each intermediate is listed with its op and module, so a schedule or a custom
kernel can find it in its own model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import graphkit
from graphkit.models.specs import load_spec, spec_inputs_as_call


def groups_json(spec: str) -> dict[str, Any]:
    """The groups of the model ``spec`` names, as plain JSON-ready data."""
    module, inputs = load_spec(spec)
    args, kwargs = spec_inputs_as_call(inputs)
    _, graph = graphkit.trace(module, *args, **kwargs)
    groups = graphkit.param_groups(graph)
    entries = []
    for group in groups:
        entries.append(
            {
                "index": group.index,
                "params": list(group.params),
                "flags": [str(flag) for flag in group.flags],
                "intermediates": [
                    {
                        "node": node,
                        "op": graph.nodes[node]["op"],
                        "module": graph.nodes[node]["module_path"],
                        "num_outputs": graph.nodes[node]["num_outputs"],
                    }
                    for node in group.intermediates
                ],
                "parameter_only_outputs": [entry.name for entry in group.output_entries],
            }
        )
    return {
        "spec": spec,
        "nodes": graph.number_of_nodes(),
        "stage_inputs": [endpoint.name for endpoint in graph.inputs],
        "groups": entries,
        "unused_params": list(groups.unused_params),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="zoo:gpt_stage", help="model spec (default zoo:gpt_stage)")
    parser.add_argument("-o", "--output", help="write to this file instead of standard output")
    arguments = parser.parse_args()

    text = json.dumps(groups_json(arguments.spec), indent=2) + "\n"
    if arguments.output:
        Path(arguments.output).write_text(text)
        print(f"wrote {arguments.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
