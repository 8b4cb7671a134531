"""XLA:CPU profiles: every XLA op that ran is work, so a step's other compute is the union of its non-matmul op time.

The union is computed here independently (sort and merge, per step window),
not with the analyzer's sweep.
"""

from __future__ import annotations

import pytest

from tests.builders import FIXTURES, union_us
from traceflops.run.load import analyze

OWN = sorted((FIXTURES / "jax").glob("*.xplane.pb*"))
SHARED = ("jax_cpu_remat_none.xplane.pb", "jax_cpu_remat_block1.xplane.pb", "jax_cpu_remat_full.xplane.pb")




def check(path: str) -> None:
    a = analyze(path)
    ops = a.ops.filter(a.ops["cat"] == "xla_op")
    assert ops.height
    every = [(t, t + d) for t, d in ops.select("ts", "dur").iter_rows()]
    mm = [(t, t + d) for t, d, m in ops.select("ts", "dur", "matmul").iter_rows() if m]
    for r in a.steps.iter_rows(named=True):
        lo, hi = r["start"], r["start"] + r["window"]
        busy, matmul = union_us(every, lo, hi), union_us(mm, lo, hi)
        assert r["time_other_compute"] == pytest.approx(busy - matmul, abs=1e-6)
        assert r["time_matmul"] == pytest.approx(matmul, abs=1e-6)
        assert r["time_idle"] == pytest.approx(r["window"] - busy, abs=1e-6)
        assert r["time_other_compute"] > 0


@pytest.mark.parametrize("path", OWN, ids=lambda p: p.name)
def test_own_profiles(path):
    check(str(path))


@pytest.mark.parametrize("name", SHARED)
def test_shared_cpu_profiles(shared, name):
    check(str(shared / "xplane" / name))
