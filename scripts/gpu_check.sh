#!/usr/bin/env bash
# GPU checks of graphkit's split backward: run on a machine with a CUDA device (CI has none).
#
#   bash scripts/gpu_check.sh [DEVICE]      DEVICE defaults to cuda
#
# 1. `graphkit verify` on every zoo model and on transformers models built from configs, on DEVICE, in
#    float32 and with bfloat16 autocast: prints one line per run and fails if any gradient differs.
# 2. The split unit tests and the random-model property test, with their models moved to DEVICE.
# 3. The split benchmark on DEVICE: (B+W)/full per model, among them GPT-2-small-sized stages (4 blocks,
#    d=768) with microbatches of 1x1024 and 8x1024 tokens; Bpy: B's host time outside its engine call.
# 4. The compiled split benchmark on DEVICE (bench/split_compiled.py): blocks compiled with
#    graphkit.splitting_backend() (inductor), their I + W against the compiled and the eager full backward.
# Uses .venv/bin/python when present (set PYTHON to override). Exit status: non-zero if any check failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
device="${1:-cuda}"
python_bin="${PYTHON:-.venv/bin/python}"
[[ -x "$python_bin" ]] || python_bin=python3
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0

"$python_bin" - "$device" <<'PY' || failed=1
import json, subprocess, sys
import torch
device = sys.argv[1]
if device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__}")
from graphkit.models import zoo
specs = [f"zoo:{name}" for name in zoo.MODELS] + [
    "hf:gpt2", "hf:gpt2?stage=middle", "hf:llama?stage=middle", "hf:bert", "hf:mixtral?stage=middle", "hf:t5",
]
print(f"== graphkit verify on {device} ({torch.cuda.get_device_name() if device.startswith('cuda') else 'cpu'})")
print(f"{'spec':28s} {'mode':10s} {'ok':5s} {'groups':>6s} {'worst rel err':>14s} {'(B+W)/full FLOPs':>17s}")
bad = 0
for spec in specs:
    for mode, extra in (("float32", ["--dtype", "float32"]), ("bf16-auto", ["--autocast", "bfloat16"])):
        result = subprocess.run(
            [sys.executable, "-m", "graphkit", "verify", spec, "--device", device, "--json", *extra],
            capture_output=True, text=True,
        )
        try:
            report = json.loads(result.stdout)
        except json.JSONDecodeError:
            print(f"{spec:28s} {mode:10s} ERROR {result.stderr.strip().splitlines()[-1:]}")
            bad += 1
            continue
        errors = [c["relative_error"] or 0.0 for c in report["inputs"] + report["params"]]
        flops = report["flops"]
        ratio = f"{(flops['b'] + flops['w']) / flops['full']:17.3f}" if flops["full"] else f"{'n/a (not counted)':>17s}"
        print(f"{spec:28s} {mode:10s} {str(report['ok']):5s} {report['groups']:6d} {max(errors, default=0):14.2e} {ratio}")
        bad += not report["ok"]
sys.exit(1 if bad else 0)
PY

echo "== split unit tests on $device"
GRAPHKIT_TEST_DEVICE="$device" "$python_bin" -m pytest -q -p no:cacheprovider tests/test_split.py tests/test_split_property.py \
    || failed=1

echo "== split benchmark on $device"
"$python_bin" bench/split.py --device "$device" --repeat 20 --warmup 5 \
    --only encoder-12x64 mlp-48-linear-gelu encoder-4x512 gpt2-stage llama-stage gpt2-small-1x1024 gpt2-small-8x1024 \
    || failed=1

echo "== compiled split benchmark on $device"
"$python_bin" bench/split_compiled.py --device "$device" --repeat 20 --warmup 5 --no-floor || failed=1

exit "$failed"
