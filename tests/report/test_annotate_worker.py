"""`annotate` reads the input in a worker process beside the analysis: the same document, summary and errors as when
it reads the input itself, and nothing left behind when the worker or the command stops."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import psutil
import pytest

from tests.builders import write_doc
from tests.report.test_annotate import gpu_doc
from traceflops.core.errors import EXIT_FORMAT, EXIT_INPUT, InputError
from traceflops.export.perfetto import start_reading
from traceflops.export.perfetto.reader_start import ENV

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, worker: bool, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **{ENV: "1" if worker else "0"})
    return subprocess.run([sys.executable, "-m", "traceflops.cli", *map(str, args), "--no-cache"], env=env, cwd=cwd,
                          capture_output=True, text=True)


def layouts(tmp_path: Path) -> dict[str, Path]:
    """Inputs that take every route of the reading: plain entries, entries a rule decodes, layouts the parser reads."""
    plain = write_doc(gpu_doc(), tmp_path / "plain.json.gz")
    doc = gpu_doc()
    doc["traceEvents"][3].setdefault("args", {})["note"] = "caf\u00e9 token=PLANTEDsecret"  # decoded and redacted
    doc["traceEvents"].append({"ph": "i", "name": "m", "pid": 1, "tid": 1, "ts": 1, "s": "t", "args": {"x": 1e400}})
    decoded = tmp_path / "decoded.json"
    decoded.write_text(json.dumps(doc).replace("1e400", "1e300"))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + orjson.dumps(gpu_doc()))
    twice = tmp_path / "two_arrays.json"
    events = orjson.dumps(gpu_doc()["traceEvents"])
    twice.write_bytes(b'{"traceEvents": ' + events + b', "x": 1, "traceEvents": []}')
    key_twice = tmp_path / "key_twice.json"  # the head read whole differs from its part before the events
    key_twice.write_bytes(orjson.dumps({"run": "first", **gpu_doc()})[:-1] + b',"run":"second"}')
    return {"plain": Path(plain), "decoded": decoded, "byte-order mark": bom, "two arrays": twice,
            "a key given again after the events": key_twice}


@pytest.mark.parametrize("name", ["plain", "decoded", "byte-order mark", "two arrays",
                                  "a key given again after the events", "shared"])
def test_the_worker_writes_what_reading_in_the_command_writes(tmp_path, name, shared):
    src = shared / "kineto" / "h100_qwen_inference.json.gz" if name == "shared" else layouts(tmp_path)[name]
    outs = []
    for worker in (True, False):
        (tmp_path / str(worker)).mkdir()
        out = tmp_path / str(worker) / "out.json"
        done = cli("annotate", src, "-o", out.name, worker=worker, cwd=out.parent)
        assert done.returncode == 0, done.stderr
        outs.append((out.read_bytes(), done.stderr))
    assert outs[0] == outs[1]  # byte for byte, and the same summary line
    assert b"PLANTED" not in outs[0][0]
    if name.startswith("a key"):
        assert orjson.loads(outs[0][0])["run"] == "second"


def test_an_error_of_the_reading_is_said_as_the_command_says_it(tmp_path):
    """A cut file is analysed but not annotated: one line, the same with and without the worker."""
    raw = orjson.dumps(gpu_doc())
    src = tmp_path / "cut.json"
    src.write_bytes(raw[: len(raw) - 30])
    got = [cli("annotate", src, "-o", tmp_path / f"o{w}.json.gz", worker=w) for w in (True, False)]
    assert [g.returncode for g in got] == [EXIT_FORMAT, EXIT_FORMAT]
    assert got[0].stderr == got[1].stderr and "not a complete JSON document" in got[0].stderr
    assert got[0].stderr.count("\n") == 1 and list(tmp_path.glob("o*")) == []


def test_a_file_the_analysis_refuses_is_named_by_the_analysis(tmp_path):
    """The worker's own error on a file that is no trace never replaces the analysis' line."""
    src = tmp_path / "notes.json"
    src.write_text('{"hello": "world"}')
    got = [cli("annotate", src, "-o", tmp_path / f"o{w}.json.gz", worker=w) for w in (True, False)]
    assert got[0].returncode == got[1].returncode != 0
    assert got[0].stderr == got[1].stderr


def test_a_killed_worker_is_one_clear_error_and_leaves_nothing(tmp_path):
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    beside = start_reading(src, str(tmp_path / "out.json.gz"))
    assert beside is not None
    with beside:
        beside.proc.kill()
        with pytest.raises(InputError, match="ended before it was done") as e:
            beside.result()
        assert e.value.exit_code == EXIT_INPUT
    assert beside.proc.poll() is not None and list(tmp_path.iterdir()) == [Path(src)]


def test_a_stopped_command_stops_its_worker(tmp_path):
    """Ctrl-C reaches the worker too (it ignores it: the command stops it): none is left running after the command."""
    from tests.cli.test_stopped import STOPS, _stopped, _wait_for

    doc = gpu_doc()
    doc["traceEvents"] = doc["traceEvents"] * 20000  # long enough to be stopped while the input is read
    src = tmp_path / "long.json"
    src.write_bytes(orjson.dumps(doc))
    proc = subprocess.Popen([sys.executable, "-m", "traceflops.cli", "annotate", str(src), "-o",
                             str(tmp_path / "o.json.gz"), "--no-cache"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **{ENV: "1"}))
    parent = psutil.Process(proc.pid)

    def worker():
        return [c for c in parent.children() if "prepare_worker" in " ".join(c.cmdline())]

    found = _wait_for(worker, proc, "annotate's worker")
    sig, code, line = STOPS[1]
    rc, err, _ = _stopped(proc, sig)
    assert (rc, err.strip()) == (code, line)
    _, alive = psutil.wait_procs(found, timeout=5)
    assert alive == [] and sorted(p.name for p in tmp_path.iterdir()) == ["long.json"]


def test_the_worker_is_this_package_whatever_the_folder_holds(tmp_path):
    """Started from a folder holding another `traceflops`, the worker still runs this one."""
    other = tmp_path / "traceflops"
    other.mkdir()
    (other / "__init__.py").write_text("raise SystemExit('the other traceflops was imported')\n")
    (other / "export").mkdir()
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    code = ("import sys; sys.path.remove(''); sys.path.insert(0, sys.argv[1])\n"  # this checkout, as an install would be
            "from traceflops.cli.main import main\n"
            "main(['annotate', sys.argv[2], '-o', sys.argv[3], '--no-cache'])\n")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT), src, str(tmp_path / "o.json.gz")], cwd=tmp_path,
                          env=dict(os.environ, **{ENV: "1"}), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(gzip.decompress((tmp_path / "o.json.gz").read_bytes()))["traceflops"]["events_in"] > 0


def test_the_worker_reads_on_while_the_command_is_busy(tmp_path):
    """Its replies (one a record) are taken as they come: thousands of them, more than a pipe holds, never stop it
    while this process does something else (the analysis)."""
    from traceflops.export.perfetto.prepare_worker import Beside

    doc = gpu_doc()
    doc["traceEvents"] = doc["traceEvents"] * 400
    src = write_doc(doc, tmp_path / "many.json.gz")
    with Beside(src, str(tmp_path), 256) as beside:  # a record every few entries: ~5,000 replies
        beside.proc.wait(timeout=120)  # nothing read meanwhile
        records = list(beside.follow())
        assert len(records) > 2000 and beside.result().events_in == len(doc["traceEvents"])


def test_the_parse_takes_no_helper_while_the_worker_holds_the_spare_core(tmp_path, monkeypatch):
    """Two cores: the reader takes one, the analysis the other; a decode helper would make three processes on them.
    A user's setting of the helper still wins."""
    from traceflops.parsers import helper_start

    monkeypatch.delenv(helper_start.ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv(ENV, "1")  # the worker whatever the machine's cores
    big = tmp_path / "big.json"
    big.write_bytes(b"{")
    os.truncate(big, 256 << 20)  # sparse: a size that wants a helper
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    assert helper_start.wanted(str(big))
    beside = start_reading(src, str(tmp_path / "out.json.gz"))
    assert beside is not None
    with beside:
        assert not helper_start.wanted(str(big))
        monkeypatch.setenv(helper_start.ENV, "1")
        assert helper_start.wanted(str(big))
        monkeypatch.delenv(helper_start.ENV)
        beside.result()
    assert helper_start.wanted(str(big))  # the worker stopped: the core is spare again


def _polars_threads(code: str, env: dict) -> int:
    done = subprocess.run([sys.executable, "-c", code + "\nimport polars\nprint(polars.thread_pool_size())"],
                          env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_the_readers_decision_loads_no_polars():
    """Whether annotate reads beside the analysis is known before polars loads (its thread count is fixed then)."""
    code = "import sys\nimport traceflops.export.perfetto.reader_start\nassert 'polars' not in sys.modules, 'loaded'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_the_reader_starts_before_polars_loads_and_its_records_read_after(tmp_path):
    """The command starts its reader before it loads polars (the worker's start overlaps the command's imports), and
    the records read back after that are the input's: every one of its events is written."""
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    code = (
        "import sys\n"
        "from traceflops.export.perfetto.reader_start import start_reading\n"
        f"beside = start_reading({str(src)!r}, {str(tmp_path / 'out.json.gz')!r})\n"
        "assert beside is not None, 'not started'\n"
        "assert 'polars' not in sys.modules, 'polars loaded to start the reader'\n"
        "with beside:\n"
        "    records = list(beside.follow())\n"
        "    print(len(records), beside.result().events_in)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    n_records, events_in = map(int, done.stdout.split())
    assert n_records >= 1 and events_in == len(gpu_doc()["traceEvents"])


def test_annotates_own_process_leaves_the_readers_core_to_it(tmp_path):
    """With its reader beside it, annotate's own process runs polars on one core fewer (on two cores, the reader's
    and two polars threads only contended); without it, on polars' default; a user's own setting wins."""
    from traceflops.core.limits import usable_cores

    if usable_cores() < 2:
        pytest.skip("one core: no reader runs beside the analysis")
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    bare = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    default = _polars_threads("", bare)

    def annotate(env: dict, out: str) -> int:
        code = ("from traceflops.cli.main import main\n"
                f"main(['annotate', {str(src)!r}, '-o', {str(tmp_path / out)!r}, '--no-cache'], standalone_mode=False)")
        return _polars_threads(code, env)

    assert annotate({**bare, ENV: "1"}, "a.json.gz") == usable_cores() - 1
    assert annotate({**bare, ENV: "0"}, "b.json.gz") == default
    assert annotate({**bare, ENV: "1", "POLARS_MAX_THREADS": "2"}, "c.json.gz") == 2


def test_the_options_are_checked_without_polars():
    """annotate checks its model options before it starts the reader, and that check loads no polars (the command's
    thread count for polars is decided before it loads)."""
    code = ("import sys\n"
            "from traceflops.cli.common import MODEL_OPTION_NAMES, model_options_from\n"
            "opts = model_options_from(dict.fromkeys(MODEL_OPTION_NAMES)\n"
            "    | {'exclude_steps': (), 'graph_captures': (), 'keep_last_step': False, 'group_roles': (),\n"
            "       'params': 1e6, 'layers': 2, 'heads': 4, 'head_dim': 8, 'seq_len': 16, 'hardware': 'h100-sxm'})\n"
            "assert opts.spec is not None and opts.hardware, opts\n"
            "assert 'polars' not in sys.modules, 'polars loaded to check the options'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_a_bad_option_is_one_line_before_any_reader_starts(tmp_path, monkeypatch):
    """An option annotate refuses is its one-line error (exit 2), and no reader process was started for it."""
    from click.testing import CliRunner

    import traceflops.export.perfetto.reader_start as reader_start
    from traceflops.cli.main import main

    started = []
    monkeypatch.setenv(ENV, "1")  # a reader wanted whatever the cores
    monkeypatch.setattr(reader_start, "start_reading", lambda *a: started.append(a))
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    r = CliRunner().invoke(main, ["annotate", str(src), "-o", str(tmp_path / "out.json.gz"), "--no-cache",
                                  "--layers", "0"])
    assert r.exit_code == EXIT_INPUT, r.output
    assert "--layers" in r.output and "Traceback" not in r.output
    assert started == [] and not (tmp_path / "out.json.gz").exists()


def test_a_reader_whose_command_is_gone_ends_without_a_word(tmp_path):
    """A command killed before it closes its reader: the reader's next reply meets a closed pipe and it ends, printing
    nothing (it shares the command's terminal)."""
    src = write_doc(gpu_doc(), tmp_path / "in.json.gz")
    code = ("import os\n"
            "from traceflops.export.perfetto.reader_start import start_reading\n"
            f"beside = start_reading({str(src)!r}, {str(tmp_path / 'out.json.gz')!r})\n"
            "assert beside is not None\n"
            "os._exit(0)  # as if killed: nothing closed\n")
    # The reader inherits stderr: this returns once it has ended too (the pipe's last writer gone).
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
