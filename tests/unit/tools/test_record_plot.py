"""``gpu-exporter record --plot``: what the PNG says and where its legend sits (real matplotlib)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter import python_api as gpus
from exporter.core.host import host_info
from exporter.tools import record
from tests.harness.cli import gx

pytest.importorskip("matplotlib", reason="the plot needs matplotlib (a test dependency)")


def recorded() -> gpus.Recording:
    """A short real recording of simulated GPUs through the Python API (start and stop each sample)."""
    m = gpus.Monitor(interval=0.05, backend="simulated")
    m.start()
    return m.stop()


def test_the_legend_is_clear_of_every_panel() -> None:
    from matplotlib.transforms import Bbox

    fig = record.plot_figure(record.plot_data(recorded()), host="node-a", simulated=True)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert [t.get_text() for t in legend.get_texts()] == ["gpu 0", "gpu 1", "gpu 2", "gpu 3"]
    for ax in fig.axes:
        assert not Bbox.intersection(box, ax.get_window_extent(renderer)), f"legend over {ax.get_ylabel()!r}"
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_memory_is_drawn_in_gib() -> None:
    rec = recorded()
    fig = record.plot_figure(record.plot_data(rec), host="node-a", simulated=True)
    mem = next(ax for ax in fig.axes if ax.get_ylabel().startswith("memory"))
    assert mem.get_ylabel() == "memory used (GiB)"
    drawn = mem.get_lines()[0].get_ydata()
    first = rec.gpus[0].memory_used_bytes.samples[0]
    assert first is not None and drawn[0] == pytest.approx(first / 2**30)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_title_names_host_model_and_simulated() -> None:
    result = record.plot_data(recorded())
    assert record.plot_title(result, "node-a", simulated=True).endswith(
        "node-a · Simulated GPU · SIMULATED GPUs (not real data)")
    assert "SIMULATED" not in record.plot_title(result, "node-a", simulated=False)


def test_record_plot_png_carries_the_heading(tmp_path: Path) -> None:
    from PIL import Image

    png = tmp_path / "run.png"
    p = gx("record", "--backend", "simulated", "--simulated-gpus", "2", "--interval", "0.1",
           "--plot", str(png), "--", "sh", "-c", "exit 0")
    assert p.returncode == 0, p.stderr
    with Image.open(png) as im:
        title = im.text["Title"]  # type: ignore[attr-defined]
    assert "sh -c exit 0" in title and host_info().node in title
    assert "Simulated GPU" in title and "SIMULATED GPUs" in title


def test_plot_hint_names_a_published_package() -> None:
    assert "pip install matplotlib" in record.PLOT_HINT
    assert "gpu-exporter[plot]" not in record.PLOT_HINT  # the extra is not on PyPI
