"""Secrets in a trace's metadata never reach an output: the redaction rules, and every output of a trace with secrets planted in it.

Every planted value contains PLANTED, so a leak of any part of one is found
by one substring search of each output (the planted parts that are kept, e.g.
a URL's host, never contain it).
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from tests.builders import BF16, Builder, write_doc
from traceflops.cli.main import main
from traceflops.core.redact import (
    INLINE,
    REDACTED,
    is_secret_key,
    redact,
    redact_bytes,
    redact_string,
)

MARK = "PLANTED"
GHP = "ghp_PLANTED0123456789abcdefghijklmnopqrstu"
TOKENS = {  # one of each known token shape
    "github": GHP,
    "github_pat": "github_pat_11PLANTED0123456789_abcdefghij",
    "hugging_face": "hf_PLANTEDabcdefghijklmnopq",
    "openai": "sk-PLANTEDabcdefghijklmnop0123",
    "anthropic": "sk-ant-PLANTEDabcdefghijklmnop0123",
    "slack": "xoxb-PLANTED-0123456789",
    "aws": "AKIAPLANTED012345678",
    "jwt": "eyJPLANTEDhdr0.eyJPLANTEDpay0.PLANTEDsig0",
}


# --- the rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["token", "HF_TOKEN", "github_pat", "GH_PAT", "OPENAI", "ANTHROPIC_API_KEY", "apiKey", "api-key",
                                 "aws_secret_access_key", "password", "db_passwd", "Authorization", "auth_token", "private_key",
                                 "accessKey", "credentials", "key", "x-amz-signature", "sig", "session_cookie"])
def test_secret_key_names(key):
    assert is_secret_key(key)
    value, n = redact({key: "PLANTEDvalue"})
    assert value == {key: REDACTED} and n == 1


@pytest.mark.parametrize("key", ["tokenizer", "monkey", "keyboard", "author", "path", "compute_capability", "sigma", "design",
                                 "init_method", "totalGlobalMem", "patch", "passive"])
def test_harmless_key_names(key):
    assert not is_secret_key(key)
    assert redact({key: "gpt2"}) == ({key: "gpt2"}, 0)


def test_only_strings_are_redacted_by_key():
    """Token counts are numbers: a count is never a credential, so `num_tokens` and friends stay."""
    doc = {"num_tokens": 4096, "max_tokens": 128, "tokens_per_step": 2.5e5, "use_auth": True, "token": None, "secret": ""}
    assert redact(doc) == (doc, 0)
    got, n = redact({"credentials": {"user": "PLANTEDuser", "retries": 3}, "tokens": ["PLANTEDa", "PLANTEDb"]})
    assert got == {"credentials": {"user": REDACTED, "retries": 3}, "tokens": [REDACTED, REDACTED]} and n == 3


def test_environments_dict_and_list():
    got, n = redact({"system": {"env": {"HF_TOKEN": "PLANTEDenv", "HOME": "/root", "UNSET": None}},
                     "envs": ["WANDB_API_KEY=PLANTEDlist", "PATH=/usr/bin", "PLANTEDbare"]})
    assert got["system"]["env"] == {"HF_TOKEN": REDACTED, "HOME": REDACTED, "UNSET": None}
    assert got["envs"] == [f"WANDB_API_KEY={REDACTED}", f"PATH={REDACTED}", REDACTED]  # a list keeps the names
    assert n == 5


def test_redact_rules():
    value, n = redact({"system": {"env": {"A": "1", "B": None}}, "password": "x", "monkey": "ok", "private_key": "k",
                       "list": [{"auth_token": "t"}], "key": "v", "keyboard": "ok"})
    assert value == {"system": {"env": {"A": REDACTED, "B": None}}, "password": REDACTED, "monkey": "ok",
                     "private_key": REDACTED, "list": [{"auth_token": REDACTED}], "key": REDACTED, "keyboard": "ok"}
    assert n == 5


@pytest.mark.parametrize("text, want", [
    ("tcp://user:PLANTEDpw@host:29500", f"tcp://user:{INLINE}@host:29500"),
    ("postgres://u:PLANTED@pw@db.internal/runs", f"postgres://u:{INLINE}@db.internal/runs"),
    ("redis://:PLANTEDpw@cache:6379/0", f"redis://:{INLINE}@cache:6379/0"),
    ("s3://b/t.json?token=PLANTED1&sig=PLANTED2&page=2", f"s3://b/t.json?token={INLINE}&sig={INLINE}&page=2"),
    ("https://h/x?X-Amz-Signature=PLANTED&key=PLANTEDk", f"https://h/x?X-Amz-Signature={INLINE}&key={INLINE}"),
    ("train.py --hf-token PLANTED1 --token=PLANTED2 --password 'PLANTED 3' --api-key=PLANTED4 --lr 3e-4",
     f"train.py --hf-token {INLINE} --token={INLINE} --password {INLINE} --api-key={INLINE} --lr 3e-4"),
    ("train.py --max-tokens 128 --num_tokens=5 --use-auth-token --seq 4", "train.py --max-tokens 128 --num_tokens=5 --use-auth-token --seq 4"),
    ("HF_TOKEN=PLANTED1 OMP_NUM_THREADS=4 python x.py", f"HF_TOKEN={INLINE} OMP_NUM_THREADS=4 python x.py"),
    ("Server=h;Database=d;Password=PLANTED;", f"Server=h;Database=d;Password={INLINE};"),
    ("Authorization: Bearer PLANTEDbearer0", f"Authorization: Bearer {INLINE}"),
    (f"clone https://{GHP}@github.com/o/r", f"clone https://{INLINE}@github.com/o/r"),
    *[(f"x {t} y", f"x {INLINE} y") for t in TOKENS.values()],
])
def test_value_shapes(text, want):
    assert redact_string(text)[0] == want
    assert redact({"note": text})[0] == {"note": want}


@pytest.mark.parametrize("text", [
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >",
    "triton_poi_fused_mask_hf_abcdefghijklmnopqrstuvwxyz_0",  # a prefix glued into a longer name is not a token
    "0123456789abcdef0123456789abcdef01234567",  # a git hash
    "GPU-5c3a8f7e-1d2b-4c5d-9e8f-0a1b2c3d4e5f",  # a device UUID
    "file:///tmp/trace.json", "user@host:/data", "env://",
    "asttokens==3.0.0", "google-auth==2.40.3", "tiktoken=0.9.0", "PyJWT==2.3.0", "--hf-token-cache-size 2.5.1",  # pins and versions
])
def test_names_and_hashes_are_kept(text):
    assert redact_string(text) == (text, 0)


def _without_env(v):
    """The value with every environment mapping dropped (those are replaced whole on purpose)."""
    if isinstance(v, dict):
        return {k: _without_env(x) for k, x in v.items() if str(k).lower() not in ("env", "envs", "environ", "environment")}
    return [_without_env(x) for x in v] if isinstance(v, list) else v


def test_real_traces_metadata_is_not_over_redacted(shared):
    """The shared traces hold no secret outside their environments: their metadata and labels come out unchanged."""
    seen = 0
    for path in sorted((shared / "kineto").glob("**/*.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        if not isinstance(doc, dict):
            continue
        meta = _without_env({k: v for k, v in doc.items() if k != "traceEvents"})
        labels = [e.get("args") for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "M"]
        assert redact(meta) == (meta, 0), path.name
        assert redact(labels) == (labels, 0), path.name
        seen += 1
    assert seen


def test_redact_bytes_keeps_json_valid():
    doc = {"a": f"x {GHP}", "b": ["tcp://u:PLANTEDpw@h:1"], "c": "q\"uote \\ tcp://u:v\"@h", TOKENS["hugging_face"]: 1}
    data, n = redact_bytes(json.dumps(doc).encode())
    got = json.loads(data)
    assert MARK not in data.decode() and n == 3
    assert got["a"] == f"x {INLINE}" and got["c"] == doc["c"]  # no match across a quote


# --- every output of a trace with secrets planted ------------------------------------------------


def planted_trace(path: Path) -> tuple[str, list[str]]:
    """A GPU trace with a secret in every place metadata sits; the path and the planted values."""
    b = Builder()
    b.device_properties[0]["provisioning_token"] = "PLANTEDdevice0"
    b.device_properties[0]["notes"] = f"ghp via {TOKENS['github_pat']}"
    b.distributed = {"backend": "nccl", "rank": 0, "world_size": 1,
                     "init_method": "tcp://trainer:PLANTEDinit@10.0.0.1:29500"}
    b.events.append({"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "ts": 0,
                     "args": {"name": "python train.py --hf-token PLANTEDmeta1 --password PLANTEDmeta2"}})
    b.events.append({"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "ts": 0,
                     "args": {"name": f"worker token=PLANTEDmeta3 {TOKENS['slack']}", "api_key": "PLANTEDmeta4"}})
    b.annotation("ProfilerStep#1", 50, 950)
    b.op("aten::mm", 100, 40, **{"Input Dims": [[64, 32], [32, 16]], "Input type": [BF16, BF16], "label": TOKENS["jwt"]})
    b.kernel("sm90_gemm_fwd", 105, 160, 30)
    b.op("aten::mm", 300, 40, **{"Input Dims": [[64, 16], [16, 32]], "Input type": [BF16, BF16]})
    b.kernel("sm90_gemm_bwd", 305, 400, 30)
    doc = b.doc()
    doc.update({
        "traceName": "s3://bucket/run/trace.json?token=PLANTEDquery1&sig=PLANTEDquery2&page=1",
        "github_pat": "PLANTEDtoplevel1",
        "OPENAI": "PLANTEDtoplevel2",
        "envs": ["HF_TOKEN=PLANTEDenvlist", "PATH=/usr/bin"],
        "metadata": {"env": {"WANDB_API_KEY": "PLANTEDenvdict"}, "num_tokens": 4096, "tokenizer": "gpt2",
                     "launch": {"command": "torchrun train.py --hf-token PLANTEDflag1 --token=PLANTEDflag2 --password PLANTEDflag3 "
                                           "--api-key=PLANTEDflag4 --max-tokens 128"},
                     "results_db": "postgres://runs:PLANTEDdb@db.internal:5432/runs",
                     "notes": " ".join(v for k, v in TOKENS.items() if k not in ("github_pat", "slack", "jwt"))},
    })
    planted = sorted({*TOKENS.values(), *_marked(doc)})
    return write_doc(doc, path), planted


def _marked(v) -> list[str]:
    """Every planted secret of a document: the PLANTED words of its strings."""
    text = json.dumps(v)
    return [w for w in text.replace('"', " ").replace("=", " ").replace("@", " ").replace(":", " ").split() if MARK in w]


def leaks(text: str, planted: list[str]) -> list[str]:
    return [p for p in planted if p in text] + ([MARK] if MARK in text else [])


def bundle_text(path: Path) -> str:
    """A zip bundle (.tfsum, .tfcache) as text: its JSON members as written, its tables as NDJSON (nested columns too)."""
    parts = []
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            raw = z.read(name)
            parts.append(pl.read_parquet(io.BytesIO(raw)).write_ndjson() if name.endswith(".parquet") else raw.decode("utf-8", "replace"))
    return "\n".join(parts)


def output_text(path: Path) -> str:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw).decode()
    if raw[:2] == b"PK":
        return bundle_text(path)
    return raw.decode("utf-8", "replace")


def run(*args) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of the command line."""
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def planted(tmp_path):
    return planted_trace(tmp_path / "planted.json.gz")


def test_the_planted_trace_carries_every_kind(planted):
    src, secrets = planted
    text = gzip.decompress(Path(src).read_bytes()).decode()
    assert all(s in text for s in secrets)
    assert len(secrets) >= 25


def test_annotate_copies_no_secret(planted, tmp_path):
    src, secrets = planted
    out = tmp_path / "annotated.json.gz"
    code, said, err = run("annotate", src, "-o", out, "--no-cache")
    assert code == 0, err
    text = output_text(out)
    assert leaks(text, secrets) == [] and leaks(said + err, secrets) == []
    got = json.loads(text)
    # what is not secret stays: the host of the rendezvous, the counts, the trace's own name and page
    assert got["distributedInfo"]["init_method"] == f"tcp://trainer:{INLINE}@10.0.0.1:29500"
    assert got["traceName"] == f"s3://bucket/run/trace.json?token={INLINE}&sig={INLINE}&page=1"
    assert got["envs"] == [f"HF_TOKEN={REDACTED}", f"PATH={REDACTED}"]
    assert (got["metadata"]["num_tokens"], got["metadata"]["tokenizer"]) == (4096, "gpt2")
    assert got["metadata"]["launch"]["command"].endswith("--max-tokens 128")
    assert got["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert got["traceflops"]["redacted_values"] >= len(secrets) - 2  # the query's and the flags' values count one each


def test_annotate_output_still_analyses_the_same(planted, tmp_path):
    src, _ = planted
    out = tmp_path / "annotated.json.gz"
    assert run("annotate", src, "-o", out, "--no-cache")[0] == 0
    a = json.loads(run("analyze", src, "--format", "json", "--no-cache")[1])
    b = json.loads(run("analyze", out, "--format", "json", "--no-cache")[1])
    assert a["totals"] == b["totals"] and a["totals"]["flops"]["executed"] == 2 * 2 * 64 * 32 * 16  # both GEMMs


def test_analyze_json_and_html_copy_no_secret(planted, tmp_path):
    src, secrets = planted
    html = tmp_path / "report.html"
    code, said, err = run("analyze", src, "--format", "json", "--html", html, "--no-cache")
    assert code == 0, err
    assert json.loads(said)["schema"] == "traceflops.report/1"
    assert leaks(said + err, secrets) == [] and leaks(output_text(html), secrets) == []
    code, said, err = run("analyze", src, "--no-cache")  # the terminal report
    assert code == 0, err
    assert leaks(said + err, secrets) == []


def test_summarize_copies_no_secret(planted, tmp_path):
    src, secrets = planted
    out = tmp_path / "rank0.tfsum"
    code, said, err = run("summarize", src, "-o", out, "--no-cache")
    assert code == 0, err
    assert leaks(output_text(out), secrets) == [] and leaks(said + err, secrets) == []


def test_the_parsed_trace_cache_holds_no_secret(planted, tmp_path):
    src, secrets = planted
    cache = tmp_path / "cache"
    code, _, err = run("analyze", src, "--format", "json", "--cache-dir", cache)
    assert code == 0, err
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert files
    assert {str(p): leaks(output_text(p), secrets) for p in files} == {str(p): [] for p in files}


SHAPED = [f"x {t} y" for t in TOKENS.values()] + [
    "tcp://user:PLANTEDpw@host:29500", "redis://:PLANTEDpw@cache:6379/0", f"clone https://{GHP}@github.com/o/r",
    "-----BEGIN RSA PRIVATE KEY-----\\nMIIBPLANTED\\n-----END RSA PRIVATE KEY-----",
]
FILLER = b'{"name":"sm90_gemm_weight_grad","ts":12.5,"args":{"grid":[1,2,3]}},' * 6000  # ~400 KB, no rule's lead


@pytest.mark.parametrize("text", SHAPED)
def test_redact_bytes_finds_a_shape_at_the_end_of_a_long_text(text):
    short = json.dumps({"note": text}).encode()
    want, n = redact_bytes(short)
    assert n >= 1 and want != short
    assert redact_bytes(FILLER + short) == (FILLER + want, n)
    assert redact_bytes(FILLER + b"\xff" + short) == (FILLER + b"\xff" + want, n)  # not UTF-8 throughout


def test_redact_bytes_runs_no_rule_over_a_long_text_without_any_rules_lead(monkeypatch):
    """One search for the leads decides it: the rules' passes (a regex each) are not run."""
    from traceflops.core import redact as module

    def rules_ran(rules, data):
        raise AssertionError("the shape rules ran")

    monkeypatch.setattr(module, "_apply", rules_ran)
    assert len(FILLER) > 1 << 18
    got, n = redact_bytes(FILLER)
    assert got is FILLER and n == 0
    with pytest.raises(AssertionError, match="rules ran"):  # a text holding a lead is searched by the rules
        redact_bytes(FILLER + b"hf_")


def test_the_added_activities_skip_the_byte_search_only_where_no_rule_changes_their_text():
    """`Added.shapes_free` decides from the distinct values and one event's text; the truth is the shape rules run
    over every event's text as written. Names with a rule's shape (anywhere, or made by an escape: a newline before
    'pm_' is written '\\npm_') must be searched; names with none need not be."""
    import random

    from traceflops.export.perfetto.added import json_nums, json_strings, json_values
    from traceflops.export.perfetto.tracks import Added

    rng = random.Random(3)
    shaped = [*TOKENS.values(), "ckpt at s3://bucket/x", "\npm_" + "a" * 36, "x\nnpm_" + "b" * 36]
    plain = ["sm90_gemm", "void at::native::elementwise_kernel<128, 2>", "ncclKernel_AllReduce", "ampere_sgemm", "a:b"]
    spec = (("kernel_id", "kernel_id", json_values), ("traceflops.class", "cls", json_strings),
            ("traceflops.flops", "flops", json_nums), ("stream", "stream", json_values))
    seen = set()
    for _ in range(60):
        n = rng.randint(1, 40)
        names = [rng.choice(plain) for _ in range(n)]
        if rng.random() < 0.5:
            names[rng.randrange(n)] = rng.choice(plain) + rng.choice(shaped) + rng.choice(["", " tail"])
        frame = pl.DataFrame({
            "kernel_id": range(n), "name": names, "cls": [rng.choice(["matmul", None]) for _ in range(n)],
            "flops": [rng.choice([None, 12.0, 3.5e20]) for _ in range(n)], "stream": [str(rng.randint(0, 9))] * n,
            "ts": [rng.random() * 1e6 for _ in range(n)], "dur": [1.5] * n, "_tid": [1] * n,
            "_meta": ['{"ph":"M","name":"thread_name","args":{"name":"traceflops: forward"}},'] + [""] * (n - 1),
        })
        added = Added([], frame, spec, 7, 0, 0, [])
        text = ",".join(added.texts()).encode()
        changed = redact_bytes(text)[1] > 0
        free = added.shapes_free()
        assert not (free and changed)  # never skips a text a rule changes
        assert free == (not any(any(s in nm for s in shaped) for nm in names))  # and skips every other one here
        seen.add(free)
    assert seen == {True, False}
