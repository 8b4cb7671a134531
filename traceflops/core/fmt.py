"""Numbers as text, the same way in every report and message: percentages, durations, SI prefixes, bytes, names."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceflops.core.sections import BudgetUnknown, Totals

NONE = "—"  # what an unknown number reads as

# C0 controls (newline and tab included: a name must not forge a line), DEL, the C1 controls (0x9b is a one-byte CSI),
# and the invisible characters that reorder or hide text (bidi overrides and isolates, zero-width marks, line and
# paragraph separators: a "Trojan Source" name reads differently from what it is).
_INVISIBLE = "\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
# Lone surrogates: a file name's bytes that are not UTF-8 (Python keeps b'\xff' as '\udcff'), or a trace's "\ud800".
# No encoder takes them, so every text shown or written has them as escapes (`\xff` for a file name's byte).
_SURROGATES = "\ud800-\udfff"
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}{_SURROGATES}]")
_CONTROL_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{_INVISIBLE}{_SURROGATES}]")
_SURROGATE = re.compile(f"[{_SURROGATES}]")


def _escaped(ch: str) -> str:
    n = ord(ch)
    if 0xDC80 <= n <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode keeps it
        n -= 0xDC00
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def encodable(s: str) -> str:
    """`s` with its lone surrogates as escapes (else as is): text any UTF-8 writer takes."""
    return _SURROGATE.sub(lambda m: _escaped(m.group()), s) if _SURROGATE.search(s) else s


def path_text(path) -> str | None:
    """A file name as text: bytes that are not UTF-8 (kept by Python as lone surrogates) written as `\\xff` escapes."""
    if path is None:
        return None
    return encodable(str(path))


def pct(v, digits: int = 1, keep_small: bool = True) -> str:
    """A fraction as a percentage, never '-0.0%'; tiny non-zero values keep two significant digits unless `keep_small`
    is off."""
    if v is None:
        return NONE
    x = float(v) * 100
    if abs(x) < 1e-4:
        x = 0.0
    if keep_small and x != 0 and abs(x) < 0.5 * 10**-digits:
        return f"{x:.2g}%"
    out = f"{x:.{digits}f}%"
    return out[1:] if out.startswith("-") and float(out[:-1]) == 0 else out


def pp(v, signed: bool = False) -> str:
    """A fraction as a percentage, or a change of one in percentage points."""
    if v is None:
        return NONE
    return f"{v * 100:+.2f} pp" if signed else f"{v * 100:.2f}%"


def ms(us, signed: bool = False) -> str:
    """Microseconds as milliseconds."""
    if us is None:
        return NONE
    return f"{us / 1e3:+.3f} ms" if signed else f"{us / 1e3:.3f} ms"


def duration(us: float | None) -> str:
    """Microseconds in the unit that reads best: µs, ms or s."""
    if us is None:
        return NONE
    x = float(us)
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f} s"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.2f} ms"
    return f"{x:.1f} µs"


def si(v, unit: str = "", sep: str = " ") -> str:
    """A count with an SI prefix (K … P) and three significant digits."""
    if v is None:
        return NONE
    v = float(v)
    for u, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{sep}{u}{unit}"
    return f"{v:.3g}{sep}{unit}".rstrip()


def nbytes(n: float) -> str:
    """Bytes in decimal units."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def tflops(x: float | None) -> str:
    """A rate in FLOP/s as whole TFLOP/s."""
    return "?" if x is None else f"{x / 1e12:.0f} TFLOP/s"


def short(s: Any, n: int = 48, none: str = "(none)") -> str:
    """A name cut to `n` characters, the cut marked with an ellipsis."""
    s = none if s is None else str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def named(s: Any, n: int = 70, none: str = "(none)") -> str:
    """A kernel's or module's name inside a sentence (advice evidence): whole when it fits in `n` characters, else
    shortened by meaning (`kernel_short`), never cut mid-name, so what the line names can still be searched for."""
    if s is None:
        return none
    s = str(s)
    return s if len(s) <= n else kernel_short(s)


def printable(s: Any, n: int | None = None, keep_newlines: bool = False) -> str:
    """Text from a trace made safe for a terminal: control characters as visible `\\xNN`, then cut to `n` (escaping
    first, so a cut never leaves half an escape sequence).

    `keep_newlines` is for whole lines a renderer composed itself, never for one value.
    """
    pattern = _CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL
    s = pattern.sub(lambda m: _escaped(m.group()), str(s))
    return s if n is None else short(s, n)


def flops(v) -> str:
    """A FLOP count, compact (`1.23T`), for tables."""
    return si(v, sep="")


def counted(lines) -> list[tuple[str, int]]:
    """Each distinct line once, in first-seen order, with how often it came: a report says a repeated line once."""
    seen: dict[str, int] = {}
    for line in lines:
        seen[line] = seen.get(line, 0) + 1
    return list(seen.items())


def times(line: str, n: int) -> str:
    """A line with its repeat count, `(×n)`, when it came more than once."""
    return line if n <= 1 else f"{line} (×{n})"


def ranks(rs) -> str:
    """Rank numbers as a reader scans them: `rank 3`, `ranks 0-7`, `ranks 1, 3, 5-7` (runs of consecutive ranks
    joined)."""
    xs = sorted(set(rs))
    runs: list[list[int]] = []
    for r in xs:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    body = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"rank {body}" if len(xs) == 1 else f"ranks {body}"


def bound_words(totals: Totals) -> str:
    """What partial FLOP coverage makes of MFU and HFU: lower bounds, or unknown when nothing was counted."""
    return "MFU and HFU are lower bounds" if totals.hfu is not None else "MFU and HFU are unknown"


def a_run(precision: str) -> str:
    """'an fp32 run', 'a tf32 run': the article as the name is read aloud (eff, eye; tee, bee)."""
    return f"{'an' if precision[:1] in ('f', 'i') else 'a'} {precision} run"


def precision_words(by: dict[str, float]) -> str:
    """What an fp32 / TF32 run's MFU against the tensor-core peaks means, after 'MFU by peak: ...' ('' for others)."""
    own = next(iter(by), None)
    if own not in ("fp32", "tf32") or len(by) < 2:
        return ""
    best, v = list(by.items())[-1]
    return (
        f": {a_run(own)}, graded against its own peak; against the {best} tensor-core peak the same work is "
        f"{pct(v)}: mixed precision (autocast to bf16/fp16) is the first lever"
    )


def budget_unknown_words(u: BudgetUnknown) -> str:
    """The loss budget's unknown terms in one line: which, why, and what they hold together."""
    return (
        f"loss budget: {', '.join(u.terms)} unknown: {u.why}. Together they hold {pct(u.share)} "
        f"of peak × time ({u.holds}); the terms shown sum to {pct(1.0 - u.share)}"
    )


# --- kernel names shortened by meaning (terminal tables; the whole name stays in JSON, HTML and the tables) ---

# Template arguments that only carry plumbing (wrappers, iterators, scalar types, traits): a kernel's distinguishing
# argument is the first other name among its template arguments.
_PLUMBING_WORDS = (
    "gpu_kernel_impl gpu_kernel_impl_nocast BinaryFunctor UnaryFunctor AUnaryFunctor BUnaryFunctor "
    "ReduceOp TensorIteratorBase TensorIterator TensorBase Tensor Scalar TensorListMetadata TensorInfo "
    "OpaqueType Array array OffsetCalculator TrivialOffsetCalculator LoadWithCast StoreWithCast "
    "LoadWithoutCast StoreWithoutCast GenericPackedTensorAccessor PackedTensorAccessor32 "
    "PackedTensorAccessor64 RestrictPtrTraits DefaultPtrTraits CatArrInputTensorMetadata TensorSizeStride "
    "MatrixShape lambda operator const volatile unsigned signed int long short char float double bool "
    "void half Half BFloat16 float2 float4 nullptr decltype true false type exists enable_if"
)
_PLUMBING = frozenset(_PLUMBING_WORDS.split())
_GENERIC_BASE = re.compile(r"^(?:kernel|Kernel\d*|device_kernel|kernel_entry|trampoline_kernel)$")
_QUALIFIED = re.compile(r"(?<![\w:])(?:[A-Za-z_]\w*::)*[A-Za-z_]\w*")
_CAST = re.compile(r"\([\w:]+\)-?\d+")  # (cudnnKernelDataType_t)0: an enum value as a template argument
_OPEN, _CLOSE = "<({[", ">)}]"


def _plumbing(ident: str) -> bool:
    return (
        ident in _PLUMBING
        or ident.endswith(("_t", "Traits", "_traits", "Params", "_params", "Metadata"))
        or ident.startswith(("__", "Float8", "float8"))
        or re.fullmatch(r"(?:Binary|Unary|Pointwise)Op\w*Functor", ident) is not None
    )


def _top_level(s: str) -> list[tuple[int, str]]:
    """(depth before, character) of `s`, angle brackets counted only outside parentheses (`(8)>(0)` is no close)."""
    out: list[tuple[int, str]] = []
    stack: list[str] = []
    for ch in s:
        out.append((len(stack), ch))
        if ch == "<" and (not stack or stack[-1] != "("):
            stack.append("<")
        elif ch in "({[":
            stack.append(ch)
        elif stack and ch == _CLOSE[_OPEN.index(stack[-1])]:
            stack.pop()
    return out


def _matching(s: str, at: int) -> int:
    """The index of the `>` closing the `<` at `at` (the end of `s` when none does)."""
    for i, (d, ch) in enumerate(_top_level(s[at:])):
        if d == 1 and ch == ">" and i > 0:
            return at + i
    return len(s)


def kernel_short(name: Any) -> str:
    """A kernel's name as a reader tells kernels apart, for narrow tables: `void`, the return type, the namespaces, the
    parameters and the template arguments dropped (`<…>`), the distinguishing template argument kept in parentheses.

    `void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>(int, ...)` reads
    `vectorized_elementwise_kernel<…> (CUDAFunctor_add)`; a name that is not a C++ signature (`sm90_xmma_gemm_…`,
    `triton_poi_fused_add_0`, `aten::mm`) is returned as it is. Deterministic; never cuts.
    """
    s = str(name).strip()
    if "<" not in s and "(" not in s:
        return s
    s = s.replace("(anonymous namespace)::", "")
    chars = _top_level(s)
    # the function: the first space-separated top-level token with a parameter list (what precedes it is its type)
    start = 0
    for i, (d, ch) in enumerate(chars):
        if d == 0 and ch == " ":
            start = i + 1
        elif d == 0 and ch == "(":
            break
    else:
        start = 0 if "<" not in s else start
    head = s[start:]
    parts: list[tuple[str, str]] = []  # (name, template arguments) of each `::` segment
    pos = 0
    while m := re.match(r"[A-Za-z_~]\w*", head[pos:]):
        seg, pos, targs = m.group(), pos + m.end(), ""
        if head.startswith("<", pos):
            close = _matching(head, pos)
            targs, pos = head[pos + 1 : close], close + 1
        parts.append((seg, targs))
        if not head.startswith("::", pos):
            break
        pos += 2
    if not parts:
        return str(name).strip()
    base, targs = parts[-1]
    if _GENERIC_BASE.match(base) and len(parts) > 1:
        base = f"{parts[-2][0]}::{base}"
    if not targs:
        return base
    args = _CAST.sub("", targs)
    if re.fullmatch(r"[A-Za-z_]\w*", args.strip()):  # one plain name: it is the kernel (cutlass::Kernel<cutlass_80_…>)
        return f"{base}<{args.strip()}>"
    ident = next(
        (q.rsplit("::", 1)[-1] for q in _QUALIFIED.findall(args) if not _plumbing(q.rsplit("::", 1)[-1])),
        None,
    )
    return f"{base}<…>" + (f" ({ident})" if ident else "")
