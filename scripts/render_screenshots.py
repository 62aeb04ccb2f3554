"""Regenerate the report pictures in docs/images from the default compile.

Writes the HTML report and the PNG chart with ``echosim compile --report``, renders the HTML
with headless Chromium (Debian's ``chromium`` package) and keeps small palette PNGs:
``docs/images/report.png`` (the top of the page as a browser shows it),
``docs/images/report-charts.png`` (the middle of the page) and ``docs/images/step-timeline.png``
(the ``--report step.png`` chart). Run with ``python scripts/render_screenshots.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]  # fmt: skip
WIDTH, HEIGHT = 1400, 4300


def small_png(image: Image.Image, path: Path, width: int) -> None:
    """Scale to ``width`` and keep 256 colours (octree, so a small patch of red stays red): sharp and small."""
    scaled = image.convert("RGB").resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    scaled.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)


def main() -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("needs Debian's chromium package (apt-get install -y chromium)")
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        page, chart, shot = Path(tmp) / "step.html", Path(tmp) / "step.png", Path(tmp) / "shot.png"
        for out in (page, chart):
            subprocess.run([sys.executable, "-m", "echosim.cli", "compile", "--report", str(out)], check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile", f"--window-size={WIDTH},{HEIGHT}",
                        f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True)  # fmt: skip
        full = Image.open(shot)
        small_png(full.crop((0, 0, WIDTH, 1240)), IMAGES / "report.png", 1000)
        small_png(full.crop((0, 1240, WIDTH, 2900)), IMAGES / "report-charts.png", 900)
        small_png(Image.open(chart), IMAGES / "step-timeline.png", 1000)
    for name in ("report.png", "report-charts.png", "step-timeline.png"):
        print(f"{IMAGES / name}: {(IMAGES / name).stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
