"""The cache folder heals itself: a failed store is retried, a killed writer's temporary goes, the folder stays bounded."""

from __future__ import annotations

import errno
import json
import os
import time

from click.testing import CliRunner

from tests.builders import scenario_trace
from traceflops.cli.main import main
from traceflops.parsers import parse
from traceflops.storage import trace_cache


def cli(*args) -> str:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


def test_a_trace_entry_not_written_is_no_warning_kept_and_is_written_later(tmp_path, monkeypatch):
    """The kept report is written, the parsed tables are not (a full disk): the next run shows no stale warning,
    and a run that parses again writes the tables."""
    trace, cdir = scenario_trace(tmp_path, "gemms"), tmp_path / "cache"
    real = trace_cache.write_bundle

    def full_disk(path, tables, meta):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(trace_cache, "write_bundle", full_disk)
    first = json.loads(cli("analyze", trace, "--format", "json", "--cache-dir", cdir, "--quiet"))
    assert any(w.startswith("cache not written") for w in first["warnings"])  # this run's trouble is said once
    assert not list(cdir.glob("*.tfcache")) and len(list(cdir.glob("*.tfreport"))) == 1
    monkeypatch.setattr(trace_cache, "write_bundle", real)
    again = json.loads(cli("analyze", trace, "--format", "json", "--cache-dir", cdir, "--quiet"))
    assert not any(w.startswith("cache not written") for w in again["warnings"])
    assert again["warnings"] == [w for w in first["warnings"] if not w.startswith("cache not written")]
    cli("analyze", trace, "--format", "json", "--cache-dir", cdir, "--quiet", "--peak-tflops", "100")
    assert len(list(cdir.glob("*.tfcache"))) == 1


def test_a_killed_writers_temporary_is_removed_and_a_live_ones_is_kept(tmp_path):
    trace, cdir = scenario_trace(tmp_path, "gemms"), tmp_path / "cache"
    cdir.mkdir()
    dead = cdir / ".0123456789abcdef0123456789abcdef.tfcache.a1b2c3d4e5f6.tmp"
    live = cdir / ".fedcba9876543210fedcba9876543210.tfreport.0f1e2d3c4b5a.tmp"
    other = cdir / ".notes.txt.a1b2c3d4e5f6.tmp"  # not a cache entry's: not the cache's to remove
    for f in (dead, live, other):
        f.write_bytes(b"partial")
    hour_ago = time.time() - 3600
    os.utime(dead, (hour_ago, hour_ago))
    os.utime(other, (hour_ago, hour_ago))
    cli("analyze", trace, "--format", "json", "--cache-dir", cdir, "--quiet")
    assert not dead.exists()
    assert live.exists() and other.exists()
    assert len(list(cdir.glob("*.tfcache"))) == 1


def test_the_cache_stays_within_its_bound_least_recently_used_first(tmp_path, monkeypatch):
    cdir = tmp_path / "cache"
    cdir.mkdir()
    paths = []
    for name in "abc":
        (tmp_path / name).mkdir()
        paths.append(scenario_trace(tmp_path / name, "gemms"))
    a, b, c = paths
    entry = {p: cdir / f"{trace_cache.key(p)}.tfcache" for p in paths}
    now = time.time()
    for p, age in ((a, 300), (b, 200)):
        trace_cache.store(p, parse(p), cdir)
        os.utime(entry[p], (now - age, now - age))
    assert trace_cache.load(a, cdir) is not None  # a hit: `a` is now the most recently used
    size = entry[a].stat().st_size
    monkeypatch.setenv("TRACEFLOPS_CACHE_MAX_BYTES", str(int(2.5 * size)))
    trace_cache.store(c, parse(c), cdir)
    assert entry[a].exists() and entry[c].exists()
    assert not entry[b].exists()  # the least recently used went
    monkeypatch.setenv("TRACEFLOPS_CACHE_MAX_BYTES", "0")
    trace_cache.store(b, parse(b), cdir)
    assert not list(cdir.glob("*.tfcache"))  # a bound of 0 keeps nothing


def test_the_cache_bound_is_read_in_bytes_or_with_a_unit(monkeypatch):
    for given, want in (("", 2 << 30), ("1000", 1000), ("500M", 500 << 20), ("1.5GiB", 3 << 29), ("2g", 2 << 30),
                        ("lots", 2 << 30)):
        monkeypatch.setenv("TRACEFLOPS_CACHE_MAX_BYTES", given)
        assert trace_cache.max_bytes() == want, given
