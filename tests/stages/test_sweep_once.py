"""The analysis cuts the activities into segments once: the partition, the collectives' exposure and the idle gaps
read that one sweep, and what they report is what each one's own sweep gives."""

import traceflops.pipeline as pipeline
from tests import builders as b
from traceflops.core.results import ModelOptions
from traceflops.parsers import parse
from traceflops.pipeline import analyze_trace
from traceflops.stages import comm_exposure, idle, sweep, timeline


def test_one_sweep_per_analysis_and_the_same_answers(tmp_path, monkeypatch):
    path = b.scenario_trace(tmp_path, "linking")  # a step with compute, a collective and idle time
    calls = []
    real = sweep.sweep

    def counted(kernels, steps):
        calls.append(kernels.height)
        return real(kernels, steps)

    for module in (comm_exposure, idle, timeline):
        monkeypatch.setattr(module, "sweep", counted)
    monkeypatch.setattr(pipeline, "sweep", counted)
    a = analyze_trace(parse(path), ModelOptions())
    # one sweep over all the activities (the memory-bound kernels' own partitions sweep only those)
    assert calls.count(a.kernels.height) == 1 and calls[0] == a.kernels.height > max(calls[1:], default=0)
    assert (a.kernels["cls"] == "communication").any() and a.idle_gaps.height > 0

    # each stage on its own sweep (as called without one) answers the same
    activities, steps = a.kernels, a.steps
    own = timeline.partition(activities, steps)
    shared = timeline.partition(activities, steps, real(activities, steps))
    assert own.equals(shared)
    e_own = comm_exposure.comm_exposure(activities, steps)
    assert e_own.height and e_own.equals(comm_exposure.comm_exposure(activities, steps, real(activities, steps)))
