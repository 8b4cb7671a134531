"""One report contract: single-trace and job reports validate against schema/report.schema.json, with the same row shapes.

(tests/conftest.py also validates every JSON report any test makes, as it is made.)
"""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from click.testing import CliRunner

from tests.builders import CPU, FIXTURES, ROOT
from traceflops.cli.main import main

SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def report(*args) -> dict:
    r = CliRunner().invoke(main, ["analyze", *map(str, args), "--format", "json", "--no-cache", "--quiet", "--peak-tflops", "1"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def single() -> dict:
    return report(FIXTURES / "dist" / "ddp" / "rank0.json.gz")


@pytest.fixture(scope="module")
def job() -> dict:
    return report(FIXTURES / "dist" / "ddp")


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_the_committed_schema_is_the_one_the_report_types_generate():
    """The report is its types encoded; the file is generated from them (`python -m traceflops.core.contract`)."""
    from traceflops.core.contract import schema

    assert json.loads(json.dumps(schema())) == SCHEMA, "regenerate: python -m traceflops.core.contract > schema/report.schema.json"


def test_a_single_report_is_not_a_job_report(single):
    """Each report is checked against its own shape: a single report given a job's key must have the job's others."""
    broken = copy.deepcopy(single)
    broken["job_steps"] = []
    assert any("collectives" in e.message for e in VALIDATOR.iter_errors(broken))


@pytest.mark.parametrize("path", [CPU / "ns_ckpt_nonreentrant.json.gz", FIXTURES / "jax" / "mlp_pairs.xplane.pb.gz",
                                  FIXTURES / "hf" / "gpt2.json.gz"])
def test_single_reports_validate(path):
    assert list(VALIDATOR.iter_errors(report(path))) == []


def test_job_and_single_rows_have_one_shape(single, job):
    assert list(VALIDATOR.iter_errors(job)) == []
    assert list(job["steps"][0]) == list(single["steps"][0])
    assert list(job["ranks"][0]) == list(single["ranks"][0])
    # The same rank, analysed alone or in the job, gives the same step row (clocks are not shifted in rows).
    mine = [s for s in job["steps"] if s["rank"] == 0]
    assert mine == single["steps"]


def test_the_schema_catches_a_renamed_or_missing_key(single):
    broken = copy.deepcopy(single)
    broken["steps"][0]["window"] = broken["steps"][0].pop("dur_us")  # the old job rows' name
    assert any("dur_us" in e.message for e in VALIDATOR.iter_errors(broken))
    broken = copy.deepcopy(single)
    del broken["ranks"][0]["loss_budget"]
    assert list(VALIDATOR.iter_errors(broken))
    broken = copy.deepcopy(single)
    broken["steps"][0]["flops"]["forward"] = "12"  # a count is an integer
    assert list(VALIDATOR.iter_errors(broken))
