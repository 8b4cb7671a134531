import os
import tempfile

import pytest

from tests.builders import ROOT, shared_fixtures

# The CLI caches parsed traces under the user's cache by default: keep test runs out of it.
os.environ.setdefault("TRACEFLOPS_CACHE_DIR", tempfile.mkdtemp(prefix="traceflops-test-cache-"))


@pytest.fixture
def shared():
    p = shared_fixtures()
    if not p.is_dir():
        pytest.skip(f"shared fixtures not found at {p} (set TRACEFLOPS_FIXTURES)")
    return p


SCHEMA_PATH = ROOT / "schema" / "report.schema.json"


@pytest.fixture(scope="session", autouse=True)
def every_json_report_follows_the_schema():
    """Every JSON report the suite makes, single trace or job, is checked against schema/report.schema.json as it is made."""
    import json

    import jsonschema
    import orjson

    from traceflops.report import jobreport, jsonreport

    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))

    def checked(fn):
        def to_dict(*args, **kw):
            d = fn(*args, **kw)
            doc = orjson.loads(orjson.dumps(d, option=orjson.OPT_SERIALIZE_NUMPY))
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
            assert not errors, "report breaks schema/report.schema.json:\n" + "\n".join(errors[:20])
            return d
        return to_dict

    mp = pytest.MonkeyPatch()
    mp.setattr(jsonreport, "to_dict", checked(jsonreport.to_dict))
    mp.setattr(jobreport, "to_dict", checked(jobreport.to_dict))
    yield
    mp.undo()
