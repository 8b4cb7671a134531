"""An analysis's options from what a user gave (command-line flags or API keywords), checked once for both.

Inconsistent input is an `OptionsError` (exit 2 on the command line; a
`ValueError` in Python) whose line says what to give instead.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from pathlib import Path
from typing import Any

from traceflops.core import hardware as hw
from traceflops.core.errors import OptionsError
from traceflops.core.model_options import ModelOptions
from traceflops.core.vocab import MAX_RANKS
from traceflops.flops import model as mf
from traceflops.flops.model_config import spec_from_config

MODES = (None, "training", "inference")

# The numbers a user gives, each with the range that can describe a real run (the command line's help texts state them).
# name: (whole number?, lowest, highest)
BOUNDS: dict[str, tuple[bool, float, float]] = {
    "params": (False, 1.0, 1e15),
    "layers": (True, 1, 1 << 20),
    "heads": (True, 1, 1 << 20),
    "head_dim": (True, 1, 1 << 20),
    "seq_len": (True, 1, 1 << 30),
    "tokens_per_step": (False, 1.0, 1e15),
    "tokens_per_second": (False, 1e-6, 1e15),
    "executed_flops_per_token": (False, 1.0, 1e21),
    "world_size": (True, 1, MAX_RANKS),
    "devices": (True, 1, MAX_RANKS),
    "peak_tflops": (False, 1e-6, 1e7),
    "pipeline_stages": (True, 1, 1 << 20),
    "microbatches": (True, 1, 1 << 20),
    "jobs": (True, 1, 1024),
}


def bounds_text(name: str) -> str:
    """The accepted range of option `name`, as the help text and the error say it."""
    whole, lo, hi = BOUNDS[name]
    return f"a whole number from {lo:d} to {hi:d}" if whole else f"a finite number from {lo:g} to {hi:g}"


def check_number(name: str, value: Any) -> None:
    """`value` of option `name` within BOUNDS, else an OptionsError naming the flag and the keyword (None passes: not
    given)."""
    if value is None:
        return
    whole, lo, hi = BOUNDS[name]
    kind = numbers.Integral if whole else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value) and lo <= value <= hi  # type: ignore[operator]  # typeshed: numbers.Real has no <=
    if not ok:
        flag = "--" + name.replace("_", "-")
        raise OptionsError(
            None, f"{flag} ({name}) must be {bounds_text(name)}, got {value!r}", f"give {flag} a value in that range"
        )


def check_numbers(**values: Any) -> None:
    """Every given number within its BOUNDS (one place for the command line and the Python API)."""
    for name, value in values.items():
        check_number(name, value)


def read_config(model_config: str | os.PathLike | dict) -> dict[str, Any]:
    """A Hugging Face style config: a dict as given, or read from a config.json."""
    if isinstance(model_config, dict):
        return model_config
    if not isinstance(model_config, (str, os.PathLike)):
        raise OptionsError(None, "model_config must be a path to a config.json or a dict", "pass one of those")
    try:
        cfg = json.loads(Path(model_config).read_text())
    except (OSError, ValueError) as e:
        raise OptionsError(
            str(model_config), f"cannot read a JSON config ({e})", "pass a Hugging Face style config.json"
        ) from None
    if not isinstance(cfg, dict):
        raise OptionsError(
            str(model_config), "the config is not a JSON object", "pass a Hugging Face style config.json"
        )
    return cfg


def model_spec(params=None, layers=None, heads=None, head_dim=None, seq_len=None, model_config=None):
    """A model description from all five numbers or a config; None if nothing was given."""
    if model_config is not None:
        where = None if isinstance(model_config, dict) else str(model_config)
        try:
            return spec_from_config(read_config(model_config), seq_len=seq_len)
        except OptionsError:
            raise
        except ValueError as e:
            raise OptionsError(
                where, str(e), "describe the model with --params/--layers/--heads/--head-dim/--seq-len instead"
            ) from None
    given = [params, layers, heads, head_dim, seq_len]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise OptionsError(
            None,
            "a model description needs all of params, layers, heads, head_dim and seq_len",
            "give the missing ones (--params, --layers, --heads, --head-dim, --seq-len), or a model config "
            "(--model-config)",
        )
    return mf.spec_from_flags(int(params), layers, heads, head_dim, seq_len)


def model_options(
    *,
    params=None,
    layers=None,
    heads=None,
    head_dim=None,
    seq_len=None,
    model_config=None,
    tokens_per_step=None,
    world_size=None,
    mode=None,
    hardware=None,
    precision=None,
    peak_tflops=None,
    exclude_steps=(),
    graph_captures=(),
    keep_last_step=False,
    group_roles=(),
) -> ModelOptions:
    """The `ModelOptions` of one analysis, the same from the command line and from Python."""
    if mode not in MODES:
        raise OptionsError(None, f"mode must be 'training' or 'inference', got {mode!r}", "leave it out to detect it")
    check_numbers(
        params=params,
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        seq_len=seq_len,
        tokens_per_step=tokens_per_step,
        world_size=world_size,
        peak_tflops=peak_tflops,
    )
    if hardware is not None and hw.lookup(hardware) is None:
        raise OptionsError(
            None, f"unknown hardware {hardware!r}", f"give one of {', '.join(sorted(hw.HARDWARE))}, or --peak-tflops"
        )
    return ModelOptions(
        spec=model_spec(params, layers, heads, head_dim, seq_len, model_config),
        tokens_per_step=tokens_per_step,
        world_size=world_size,
        mode=mode,
        hardware=hardware,
        precision=precision,
        peak_tflops=peak_tflops,
        exclude_steps=tuple(exclude_steps),
        graph_captures=tuple(str(p) for p in graph_captures),
        keep_last_step=bool(keep_last_step),
        group_roles=parse_group_roles(group_roles),
    )


_ROLE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def parse_group_roles(given) -> tuple[tuple[str, str], ...]:
    """`GROUP=ROLE` pairs (`--group-role`): a group's description or name (as pg_config and the report call it) and what
    it is for (dp, tp, pp, ep, cp, or a word of one's own)."""
    out = []
    for g in given or ():
        group, sep, role = str(g).partition("=")
        if not sep or not group.strip() or not _ROLE_RE.match(role.strip().lower()):
            raise OptionsError(
                None,
                f"--group-role {g!r} is not GROUP=ROLE",
                "name the group by its description or name, and the role as dp, tp, pp, ep, cp or a short word "
                "(e.g. --group-role default_pg=tp)",
            )
        out.append((group.strip(), role.strip().lower()))
    return tuple(out)
