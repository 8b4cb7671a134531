"""A TPU profile records no host launches: the parser anchors each device op to a launch of its own (named
DEVICE_SIDE_LAUNCH, inside the op's span) only so that `link` ties the device activity to its op. That anchor is no
launch time: idle gaps cannot be blamed on a late host (reason unknown, not host_bound) and a device activity that
starts before it did not start before its launch (no clock warning)."""


from traceflops.core.vocab import DEVICE_SIDE_LAUNCH
from traceflops.parsers.xla import parse_xplane


def _tpu(shared):
    return shared / "xplane" / "tpu_v6e_inference.xplane.pb"


def test_tpu_ops_are_anchored_to_device_side_launches(shared):
    t = parse_xplane(str(_tpu(shared)))
    assert t.kernels.height and set(t.launches["name"]) == {DEVICE_SIDE_LAUNCH}
    assert t.launches.height == t.kernels.height


def test_tpu_idle_gaps_are_not_host_bound(shared):
    from traceflops.run.load import analyze

    a = analyze(str(_tpu(shared)))
    gaps = a.idle_gaps
    assert gaps.height > 2000  # the profile's devices idle between ops: 2,730 gaps over 4 devices
    assert set(gaps["reason"]) == {"unknown"}
    assert gaps["next_launch_ts"].null_count() == gaps.height
    assert not [w for w in a.warnings if "before the launch" in w]
