"""Regenerate the screenshots and diagrams the documentation shows (docs/images/).

    .venv/bin/python scripts/doc_screenshots.py [--out docs/images]

- ``llama-stage.png``: ``graphkit render 'hf:llama?stage=middle&n_layer=1'`` (the README's first picture);
- ``recurrence-folded.png``: the 1500-step recurrence of bench/scale_models.py, folded;
- ``llama-3-8b-meta-stage.png``: a Llama-3-8B-sized decoder layer (4096 hidden, 2048 tokens) drawn from
  the meta device, collapsed at depth 3 (layers.0.self_attn, layers.0.mlp, ...);
- ``inspect-report.png``: the top of ``graphkit inspect zoo:gpt_ends``'s page, in headless Chromium;
- ``explorer.png`` comes from the browser test (tests/test_browser.py writes
  test-artifacts/browser-jupyterlab-explorer.png; this script copies it when present).

Needs Graphviz, and for the report screenshot Playwright with Debian's ``chromium`` (never a downloaded
browser).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_8B = (
    "hf:llama?stage=middle&hidden_size=4096&intermediate_size=14336&num_attention_heads=32"
    "&num_key_value_heads=8&n_layer=1&seq=2048&batch=1"
)


def graphkit(*arguments: str) -> None:
    subprocess.run([sys.executable, "-m", "graphkit", *arguments], cwd=ROOT, check=True)


def report_screenshot(output: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium on PATH: inspect-report.png not regenerated", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as folder:
        graphkit("inspect", "zoo:gpt_ends", "-o", folder)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto((Path(folder) / "index.html").as_uri())
            page.screenshot(path=str(output))
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    arguments = parser.parse_args(argv)
    out = arguments.out
    graphkit("render", "hf:llama?stage=middle&n_layer=1", "-o", str(out / "llama-stage.png"))
    graphkit("render", "bench/scale_models.py:recurrence", "-o", str(out / "recurrence-folded.png"))
    graphkit(
        "render",
        LLAMA_8B,
        "--device",
        "meta",
        "--collapse",
        "3",
        "--saved",
        "-o",
        str(out / "llama-3-8b-meta-stage.png"),
        "--title",
        "Llama-3-8B-sized layer on the meta device",
    )
    report_screenshot(out / "inspect-report.png")
    explorer = ROOT / "test-artifacts" / "browser-jupyterlab-explorer.png"
    if explorer.exists():
        shutil.copyfile(explorer, out / "explorer.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
