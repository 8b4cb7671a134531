"""XLA:CPU widens bf16 dots to f32: the program's precision is still bf16.

Truth: the program itself. Its parameters and activations are bf16 (`jnp.bfloat16`); XLA:CPU has no bf16 dot, so
it converts the operands to f32 and runs f32 dots (the profile's dots say f32). The same program in f32 is the
control: nothing widened, the f32 peak stays.
"""

from __future__ import annotations

import glob

import pytest

from traceflops.core.results import ModelOptions
from traceflops.run.load import analyze

jax = pytest.importorskip("jax")


def _profile(where, dtype) -> str:
    import jax.numpy as jnp

    def loss(w, x):
        h = jnp.tanh(x @ w[0])
        return (h @ w[1]).astype(jnp.float32).sum()

    step = jax.jit(jax.grad(loss))
    w = (jnp.ones((128, 256), dtype), jnp.ones((256, 64), dtype))
    x = jnp.ones((32, 128), dtype)
    jax.block_until_ready(step(w, x))
    jax.profiler.start_trace(str(where))
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            jax.block_until_ready(step(w, x))
    jax.profiler.stop_trace()
    return glob.glob(f"{where}/**/*.xplane.pb", recursive=True)[0]


def test_bf16_program_on_xla_cpu_is_graded_at_the_bf16_peak(tmp_path):
    import jax.numpy as jnp

    bf16 = analyze(_profile(tmp_path / "bf16", jnp.bfloat16), ModelOptions(hardware="h100"))
    f32 = analyze(_profile(tmp_path / "f32", jnp.float32), ModelOptions(hardware="h100"))
    # the dots of both programs read f32 operands in the profile
    for a in (bf16, f32):
        dots = a.ops.filter(a.ops["matmul"])
        assert dots.height and set(dots["dtype"].to_list()) == {"fp32"}
    assert bf16.hardware["precision"] == "bf16"
    assert bf16.hardware["peak_flops"] == pytest.approx(989.4e12)  # H100 SXM5, dense bf16
    assert any("XLA:CPU computes bf16 dots in f32" in w for w in bf16.warnings)
    assert f32.hardware["precision"] == "fp32"
    assert not any("XLA:CPU computes" in w for w in f32.warnings)
