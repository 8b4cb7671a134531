"""The terminal report at 60, 80 and 120 columns and piped: numbers whole, no column lost or wrapped word by word, no
line wider than the width (piped: only a whole name on a line of its own), and the headline flags what cannot be right.

The checks are `tools/terminal_widths.py`'s (which runs the CLI in tmux on every shared trace)."""

from __future__ import annotations

import importlib.util
import io
import json
from functools import cache

import pytest
from rich.console import Console

from tests.builders import CPU, ROOT
from traceflops.core.results import ModelOptions
from traceflops.report.console import printable_console
from traceflops.report.terminal import render
from traceflops.run.load import analyze

HF = ROOT / "fixtures" / "hf"
spec = importlib.util.spec_from_file_location("terminal_widths", ROOT / "tools" / "terminal_widths.py")
widths = importlib.util.module_from_spec(spec)
spec.loader.exec_module(widths)


@cache
def lora(hardware: str | None = "a100", peak: float | None = None):
    """The LoRA fixture with its model config: frozen weights, so MFU above HFU."""
    from traceflops.run.options import model_options

    truth = json.loads((HF / "truth.json").read_text())["llama_lora"]
    opts = model_options(model_config=truth["config"], tokens_per_step=truth["model"]["tokens_per_step"],
                         hardware=hardware, peak_tflops=peak)
    return analyze(str(HF / "llama_lora.json.gz"), opts)


def on_terminal(a, width: int) -> str:
    buf = io.StringIO()
    render(a, Console(file=buf, width=width, force_terminal=True, color_system=None))
    return buf.getvalue()


def piped(a, monkeypatch, columns: str | None = None) -> str:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    buf = io.StringIO()
    render(a, printable_console(file=buf, color_system=None))
    return buf.getvalue()


CLEAN = {"cut_numbers": 0, "long_lines": 0, "lost_columns": 0, "wrapped_rows": 0}


def analyses(shared=None):
    out = [lora(), analyze(str(CPU / "ns_ckpt_nonreentrant.json.gz"), ModelOptions(peak_tflops=1.0))]
    if shared is not None:
        out.append(analyze(str(shared / "kineto/h100_qwen_inference.json.gz"), ModelOptions()))
    return out


@pytest.mark.parametrize("width", [60, 80, 120])
def test_on_a_terminal_every_width_reads(width):
    for a in analyses():
        assert widths.check(on_terminal(a, width), width, False) == CLEAN


def test_piped_honours_columns_else_a_fixed_width(monkeypatch):
    a = lora()
    assert widths.check(piped(a, monkeypatch), widths.PIPE_WIDTH, True) == CLEAN
    narrow = piped(a, monkeypatch, "72")
    assert widths.check(narrow, 72, True) == CLEAN


@pytest.mark.parametrize("width", [60, 80, 120])
def test_a_gpu_trace_reads_at_every_width_with_kernel_names_by_meaning(shared, width):
    a = analyses(shared)[-1]
    out = on_terminal(a, width)
    assert widths.check(out, width, False) == CLEAN
    assert "elementwise_kernel<…> (MulFunctor)" in out  # shortened by meaning, not `void at::native…`
    assert "void at::native" not in out
    for mfu in a.steps["mfu"].to_list():
        assert f"{mfu * 100:.1f}%" in out  # the step's MFU whole


def test_a_gpu_trace_piped_keeps_each_whole_name_on_a_line_of_its_own(shared, monkeypatch):
    a = analyses(shared)[-1]
    out = piped(a, monkeypatch)
    assert widths.check(out, widths.PIPE_WIDTH, True) == CLEAN
    lines = out.splitlines()
    for name in a.top_kernels.head(8)["name"].to_list():
        assert sum(line.endswith(name) for line in lines) >= 1, name  # whole, on one line
    assert max(len(line) for line in lines if "│" in line) <= widths.PIPE_WIDTH


def test_the_headline_flags_mfu_above_hfu_with_the_reason():
    out = on_terminal(lora(), 80)
    head = out.split("Matmul FLOPs by phase")[0]
    assert "flag: MFU" in head and "above HFU" in head and "frozen weights" in head
    assert "extra_executed" in out and "< 0:" in out  # the budget's negative term is explained where it shows


def test_no_band_is_printed_against_an_arbitrary_peak():
    assert "band:" in on_terminal(lora(), 120)
    assert "band:" not in on_terminal(lora(None, 0.01), 120)
