"""An XLA profile's advice and warnings speak JAX: no PyTorch tool, CUDA graph or Kineto field is named."""

from __future__ import annotations

import re

import pytest

from tests.builders import FIXTURES, shared_fixtures
from traceflops.run.load import analyze

PYTORCH = re.compile(r"torch|CUDA/HIP graph|cuda graph|Input type|record_shapes|DataLoader|non_blocking", re.IGNORECASE)
PROFILES = sorted(FIXTURES.glob("jax/*.xplane.pb*")) + (sorted((shared_fixtures() / "xplane").glob("*.xplane.pb"))
                                                       if (shared_fixtures() / "xplane").is_dir() else [])


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_xla_advice_and_warnings_speak_jax(path):
    a = analyze(str(path))
    said = [w for w in a.warnings] + [r for item in a.advice for r in item["remedies"]]
    assert not [s for s in said if PYTORCH.search(s)]


def test_the_remat_advice_names_jax_policies():
    a = analyze(str(FIXTURES / "jax" / "remat_full.xplane.pb"))
    recompute = [item for item in a.advice if item["kind"] == "recompute"]
    assert recompute and "jax.checkpoint_policies" in " ".join(recompute[0]["remedies"])
