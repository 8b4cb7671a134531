"""The model section on traces whose input embedding is not in the trace, and on frozen weights."""

import json
from dataclasses import replace

import polars as pl
import pytest

from tests.builders import CPU
from traceflops.core.results import ModelOptions
from traceflops.core.sections import ModelPart, ModelSection
from traceflops.flops import model as mf
from traceflops.metrics.model_section import shortfall_warnings
from traceflops.run.load import analyze

TRUTH = json.loads((CPU / "truth.json").read_text())


@pytest.mark.parametrize("name", ["ns_compiled", "sq_compiled", "ns_compiled_manual", "sq_compiled_manual_ckpt"])
def test_seq_len_from_the_attention_when_the_embedding_is_compiled_away(name):
    """Inductor fuses the embedding lookup; T comes from the attention's query length, not the config's maximum."""
    m = TRUTH[name]["model"]
    spec = replace(mf.spec_from_flags(m["params_matmul"], m["layers"], m["heads"], m["head_dim"], 4096),
                   seq_len_source="config")
    a = analyze(str(CPU / f"{name}.json.gz"), ModelOptions(spec=spec, tokens_per_step=m["tokens_per_step"], peak_tflops=0.5))
    assert (a.model["seq_len"], a.model["seq_len_source"]) == (TRUTH[name]["shape"]["T"], "trace")
    palm = (6 * m["params_matmul"] + 12 * m["layers"] * m["heads"] * m["head_dim"] * m["seq_len"]) * m["tokens_per_step"]
    assert a.model["flops_per_step"] == palm
    assert not any("maximum context" in w for w in a.warnings)


def _model(ratio_by_part, mode="training"):
    parts = [ModelPart(part=p, params=1, model_flops_per_step=600.0, trace_flops_per_step=600.0 * r, gemms_per_step=1)
             for p, r in ratio_by_part.items()]
    executed = sum(p.trace_flops_per_step for p in parts)
    return ModelSection(source="flags", mode=mode, by_part=parts, flops_per_step=1800.0, flops_per_step_no_attention=None,
                        flops_per_step_device=1800.0, seq_len=8, seq_len_source="trace", tokens_per_step=4,
                        tokens_source="flag", band=None, band_caveat=""), executed


def _steps(executed):
    return pl.DataFrame({"step": [0], "flops_forward": [executed / 3], "flops_backward": [2 * executed / 3]})


def test_frozen_weights_are_named_not_a_counting_error():
    """Forward + data gradient only (no weight gradient): 4N of 6N per token, exactly 2/3 per part."""
    model, executed = _model({"attention": 2 / 3, "mlp": 2 / 3, "lm_head": 2 / 3})
    (w,) = shortfall_warnings(model, _steps(executed))
    assert "frozen" in w and "LoRA" in w and "check T" not in w and "not a counting error" in w


def test_a_shortfall_without_the_frozen_ratio_still_points_at_t_and_tokens():
    model, executed = _model({"attention": 0.5, "mlp": 0.5, "lm_head": 0.5})
    (w,) = shortfall_warnings(model, _steps(executed))
    assert "check T" in w and "frozen" not in w


def _totals(mfu, hfu, extra):
    from types import SimpleNamespace

    return SimpleNamespace(mfu=mfu, hfu=hfu, loss_budget={"extra_executed": extra})


def _hardware(source):
    from traceflops.core.sections import Hardware

    return Hardware(name="A100-SXM4-80GB", precision="bf16", sparse=False, peak_flops=312e12, devices=1, source=source)


def test_mfu_above_hfu_says_why_in_a_few_words():
    from traceflops.metrics.model_section import with_band

    model, _ = _model({"attention": 2 / 3, "mlp": 2 / 3, "lm_head": 2 / 3})
    frozen = with_band(model, _totals(0.255, 0.174, -0.081), _hardware("nvidia"))
    assert frozen.above_executed.startswith("MFU 25.5% above HFU 17.4%: frozen weights (attention, mlp, lm_head)")
    model, _ = _model({"attention": 0.5, "mlp": 0.5, "lm_head": 0.5})
    other = with_band(model, _totals(0.255, 0.174, -0.081), _hardware("nvidia"))
    assert "check T, tokens per step and world size" in other.above_executed
    only_budget = with_band(model, _totals(0.17, 0.18, -0.02), _hardware("nvidia"))  # recompute hides it from HFU
    assert only_budget.above_executed.startswith("model FLOPs above the executed ones (extra_executed -2.0%)")
    fine = with_band(model, _totals(0.17, 0.18, 0.01), _hardware("nvidia"))
    assert "above_executed" not in fine


def test_no_band_against_an_arbitrary_peak():
    """A band graded against --peak-tflops (or no peak) says nothing: the section holds none; a table device's does."""
    from traceflops.metrics.model_section import with_band

    model, _ = _model({"mlp": 1.0})
    assert with_band(model, _totals(0.3, 0.3, 0.0), _hardware("--peak-tflops")).band is None
    assert with_band(model, _totals(0.3, 0.3, 0.0), None).band is None
    assert with_band(model, _totals(0.3, 0.3, 0.0), _hardware("nvidia")).band == "room to improve"
