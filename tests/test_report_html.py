"""compile --report: one self-contained HTML file (charts embedded, no script, nothing fetched), or the chart alone."""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from echosim.cli import cli
from echosim.compiler import lower
from echosim.explain.charts import layer_kinds, stages_drawn
from echosim.plan import Cluster, Plan

SMALL = ["gpt3-1.3b", "--tp", "2", "--pp", "4", "--dp", "2", "--global-batch", "16", "--seq-len", "1024",
         "--backend", "h100-sxm"]  # fmt: skip
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _compile(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["compile", *args])
    return result.exit_code, result.output


def test_the_html_report_is_one_self_contained_file_with_every_chart(tmp_path: Path) -> None:
    path = tmp_path / "step.html"
    code, out = _compile(*SMALL, "--report", str(path))
    assert code == 0, out
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)">', page)
    assert [alt for alt, _ in images] == ["step timeline", "one micro-batch", "time breakdown", "memory per stage",
                                          "time per layer kind"]  # fmt: skip
    assert all(base64.b64decode(data).startswith(PNG_MAGIC) for _, data in images)
    for text in (
        "gpt3-1.3b on 16 × h100-sxm",
        "step time",
        "<td>likely step</td>",  # the accuracy band's line, as compile prints it
        "Critical path",
        "layers.*.mlp matmuls on stage 3",
        "Communication on stage",
        "<td>tp</td><td>2</td>",
        "echosim compile gpt3-1.3b --backend h100-sxm",
    ):
        assert text in page, text  # fmt: skip


def test_a_model_without_token_ids_reports_its_samples_per_second(tmp_path: Path) -> None:
    """ResNet-50's report raised a TypeError (its tokens/s is None, formatted as a number): images/s, as compile."""
    path = tmp_path / "resnet.html"
    code, out = _compile("resnet50", "--backend", "a100-80gb", "--dp", "8", "--micro-batch", "256", "--report",
                         str(path))  # fmt: skip
    assert code == 0, out
    page = path.read_text(encoding="utf-8")
    assert re.search(r"<td>throughput</td><td[^>]*>[\d,]+\.\d images/s<", page), page[:2000]
    assert re.search(r"<td>parameters</td><td[^>]*>25\.6 M<", page)


def test_the_png_is_the_timeline_chart_and_the_same_inputs_give_the_same_bytes(tmp_path: Path) -> None:
    for name in ("a.png", "b.png"):
        code, out = _compile(*SMALL, "--report", str(tmp_path / name))
        assert code == 0, out
    data = (tmp_path / "a.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and data == (tmp_path / "b.png").read_bytes()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 1000 and 200 < height < width


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("step.pdf", "--report step.pdf: unknown format '.pdf' (known: .html, .htm, .png)"),
        ("/nonexistent/dir/step.html", "--report /nonexistent/dir/step.html: cannot write (No such file or directory)"),
    ],
)
def test_bad_report_paths_are_one_line(path: str, message: str) -> None:
    code, out = _compile("gpt3-125m", "--dp", "2", "--report", path)
    assert code == 1 and "Traceback" not in out
    assert out.strip().splitlines() == [f"Error: {message}"]


def test_without_matplotlib_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out = _compile("gpt3-125m", "--dp", "2", "--report", str(tmp_path / "step.html"))
    assert code == 1 and out.strip() == "Error: --report needs matplotlib: pip install 'echosim[report]'"
    assert not (tmp_path / "step.html").exists()


def test_large_pipelines_draw_a_readable_subset_of_stages() -> None:
    assert stages_drawn(8) == list(range(8))
    picked = stages_drawn(64, keep=(37,))
    assert len(picked) <= 24 and {0, 37, 63} <= set(picked) and picked == sorted(picked)


def test_time_per_layer_kind_is_the_stage_busy_time() -> None:
    c = lower("gpt3-1.3b", Plan(tp=2, pp=4, dp=2, global_batch=16, seq_len=1024), Cluster("h100-sxm", 16))
    data = layer_kinds(c.costed, 3)
    busy = c.costed.busy(3)
    for category in ("compute.matmul", "comm.tp"):
        assert sum(k.get(category, 0.0) for k in data.values()) == pytest.approx(busy[category], rel=1e-9)
    assert "layers.*.mlp" in data and "lm_head" in data
