"""The job report (`render_job_html`): many ranks' traces as one `Job`: job MFU/HFU, per-rank bars and
loss budgets, job steps, stragglers, collectives, communication, experts, advice and pipeline bubbles.

Its own module because a job is read across ranks (who waited for whom), unlike one trace; it reuses the
single-trace sections that mean the same thing for a job (advice, communication by dimension).
"""

from __future__ import annotations

import polars as pl
from msgspec import UNSET

from traceflops.core import fmt
from traceflops.core.vocab import PARTITION
from traceflops.report.html.charts import (
    PART_COLORS,
    PART_LABELS,
    TERM_COLORS,
    TERM_HELP,
    stacked_rows_svg,
)
from traceflops.report.html.page import (
    MAX_ROWS,
    cards,
    legend,
    macros,
    num,
    page,
    table,
    warnings_list,
)
from traceflops.report.html.sections import communication_section


def rank_budgets(summaries) -> str:
    """Each rank's loss budget side by side: a stacked bar per rank and a table of terms × ranks, each term
    explained."""
    budgets = [(s.rank, s.totals.loss_budget) for s in summaries]
    if not any(b for _, b in budgets):
        return '<p class="mute">No loss budget on any rank (no step time, or no device activity).</p>'
    terms = list(dict.fromkeys(k for _, b in budgets for k in (b or {})))
    colors = {k: TERM_COLORS.get(k, "#718096") for k in terms}
    labels = {k: k.replace("_", " ") for k in terms}
    bars = [
        (f"rank {r}", {k: v for k, v in (b or {}).items() if v is not None}, "" if b else "no budget")
        for r, b in budgets
    ]
    out = legend(colors, labels) + stacked_rows_svg(bars, colors, labels, unit_us=False, css_class="rank-budgets")
    rows = [
        [
            labels[k],
            *[num("—" if (v := (b or {}).get(k)) is None else fmt.pct(v, 2), v, f"{r}:{k}") for r, b in budgets],
            TERM_HELP.get(k, ""),
        ]
        for k in terms
    ]
    return out + table(
        ["term", *[f"rank {r}" for r, _ in budgets], "what it means"],
        rows,
        css_class="rank-budget-terms",
        explain_last=True,
    )


JOB_ADVICE_NONE = (
    '<p class="mute job-advice-none">Nothing stands out across the ranks: each rank\'s own advice is in its report '
    "(traceflops analyze RANK_TRACE --html PATH); the stragglers and collectives above say which rank and which "
    "collective to look at.</p>"
)

STRAGGLER_WHY = {
    "compute": "it computed longer than the median rank in that step (more or slower kernels)",
    "idle": "its device idled longer than the median rank's (host-bound, synchronisation, launch gaps)",
    "input_pipeline": "it waited longer on input (data loading) than the median rank",
    "unclear": "none of its compute, idle or input time exceeds the median rank's: look at its collectives",
}


def stragglers_table(st: pl.DataFrame | None) -> str:
    """Per step, the rank the others waited for, its time against the median rank's, and why."""
    if st is None or st.height == 0:
        return '<p class="mute">No straggler: no collective matched across ranks.</p>'
    rows = [
        [
            num(str(r["step"]), r["step"], "step"),
            num(str(r["rank"]), r["rank"], "rank"),
            num(fmt.ms(r["wait_us"]), r["wait_us"], "wait_us"),
            num(fmt.ms(r.get("excess_compute_us"), True), r.get("excess_compute_us"), "excess_compute_us"),
            num(fmt.ms(r.get("excess_idle_us"), True), r.get("excess_idle_us"), "excess_idle_us"),
            num(
                fmt.ms(r.get("excess_input_pipeline_us"), True),
                r.get("excess_input_pipeline_us"),
                "excess_input_pipeline_us",
            ),
            r["reason"],
            STRAGGLER_WHY.get(r["reason"], ""),
        ]
        for r in st.iter_rows(named=True)
    ]
    return table(
        [
            "step",
            "rank",
            "others waited",
            "compute vs median",
            "idle vs median",
            "input vs median",
            "reason",
            "what it means",
        ],
        rows,
        left=(6,),
        css_class="stragglers",
        explain_last=True,
    )


def collectives_table(c: pl.DataFrame | None) -> str:
    """The collectives with the most arrival skew: who came last, how long the transfer took, and its bus bandwidth."""
    if c is None or c.height == 0:
        return '<p class="mute">No collective matched across ranks.</p>'
    top = c.sort("arrival_skew_us", descending=True).head(MAX_ROWS)
    g = lambda v, d=1: "—" if v is None else f"{v:.{d}f}"
    roles = "role" in c.columns and c["role"].is_not_null().any()  # the group's mesh dimension, where the trace says
    rows = [
        [
            r["pg"],
            *([r.get("role") or "—"] if roles else []),
            num(str(r["seq"]), r["seq"], "seq"),
            r["kind"],
            num(str(r["step"]), r["step"], "step"),
            num(fmt.si(r["bytes"], "B"), r["bytes"], "bytes"),
            num(str(r["ranks"]), r["ranks"], "ranks"),
            num(fmt.ms(r["arrival_skew_us"]), r["arrival_skew_us"], "arrival_skew_us"),
            num(str(r["last_rank"]), r["last_rank"], "last_rank"),
            num(fmt.ms(r["transfer_us"]), r["transfer_us"], "transfer_us"),
            num(g(r.get("algbw_gbps")), r.get("algbw_gbps"), "algbw_gbps"),
            num(g(r.get("busbw_gbps")), r.get("busbw_gbps"), "busbw_gbps"),
            num(fmt.pct(r.get("busbw_of_nvlink")), r.get("busbw_of_nvlink"), "busbw_of_nvlink"),
        ]
        for r in top.iter_rows(named=True)
    ]
    out = table(
        [
            "group",
            *(["role"] if roles else []),
            "seq",
            "kind",
            "step",
            "bytes",
            "ranks",
            "arrival skew",
            "last rank",
            "transfer",
            "alg GB/s",
            "bus GB/s",
            "of link",
        ],
        rows,
        left=(0, 1, 3) if roles else (0, 2),
        css_class="collectives",
    )
    more = f" Top {MAX_ROWS} of {c.height}." if c.height > MAX_ROWS else ""
    return str(macros("job.html").collectives(out, more))


ADVICE_HEADS = {"job": "For the job", "rank": "On the worst ranks (each item on the rank where it is largest)"}
ADVICE_LISTS = (("evidence", "evidence", "ul"), ("what to try", "remedies", "ol"))


def known(v):
    """A field's value, None where it is unset."""
    return None if v is UNSET else v


def job_advice_html(job) -> str:
    """The job's "what to try" in its two sections (`JobAdviceItem.scope`), each with its denominator said once; the
    late ranks' entry with the job at the median rank's pace."""
    out = []
    for scope, head in ADVICE_HEADS.items():
        items = [x for x in job.advice if x.scope == scope]
        if not items:
            continue
        shown = []
        for it in items:
            after = None
            if known(it.step_time_after_us) is not None:
                mfu_after, step = known(it.mfu_after), known(it.step_time_us)
                after = {
                    "mfu": num(fmt.pct(job.totals.mfu), job.totals.mfu, "mfu"),
                    "mfu_after": num(fmt.pct(mfu_after), mfu_after, "mfu_after"),
                    "step": num(fmt.ms(step), step, "step_time_us"),
                    "step_after": num(fmt.ms(it.step_time_after_us), it.step_time_after_us, "step_time_after_us"),
                    "bound": known(it.bound) or "",
                }
            shown.append(
                {
                    "kind": it.kind,
                    "scope": it.scope,
                    "rank": it.rank,
                    "title": it.title,
                    "share": num(fmt.pct(it.share, 1), it.share, "share"),
                    "term": it.term.replace("_", " ") if it.term else None,
                    "after": after,
                    "lists": [
                        (label, key, tag, getattr(it, key)) for label, key, tag in ADVICE_LISTS if getattr(it, key)
                    ],
                }
            )
        out.append(str(macros("job.html").advice(head, items[0].unit, shown)))
    return "".join(out)


def render_job_html(job, title: str | None = None) -> str:
    """The job view (many ranks): job MFU/HFU, per-rank bars, steps, stragglers, collectives."""
    t = job.totals
    title = fmt.printable(title or f"traceflops: job of {t.world_size} ranks")
    first = job.summaries[0] if job.summaries else None
    hw = first.hardware if first else None
    ck = job.clock
    items = [
        ("job MFU", fmt.pct(t.mfu), "step time = slowest rank's"),
        ("job HFU", fmt.pct(t.hfu), f"devices = world size {t.world_size}"),
        (
            "peak",
            fmt.si(hw.peak_flops, "FLOP/s") if hw and hw.peak_flops else "unknown",
            f"{(hw.name if hw else None) or '?'}, dense {(hw.precision if hw else None) or '?'}",
        ),
        (
            "wall",
            fmt.ms(t.wall_us),
            f"{job.steps.height if job.steps is not None else 0} step(s), {len(job.summaries)} traces",
        ),
        ("arrival skew", fmt.ms(t.arrival_skew_us), f"transfer {fmt.ms(t.transfer_us)}"),
        (
            "clock residual",
            "—" if ck.residual_skew_us is None else f"{ck.residual_skew_us:.2f} µs",
            f"{t.collectives_matched} matched collectives",
        ),
    ]
    from traceflops.report.jobreport import (
        warning_lines,  # a rank's warning once for all the ranks that gave it
    )

    said = warning_lines(job)
    rows = []
    for r in job.ranks.iter_rows(named=True):
        parts = {c: r.get(f"time_{c}") for c in PARTITION}
        rows.append(
            (
                f"rank {r['rank']}",
                parts,
                f"{fmt.ms(r['wall_us'])} · device MFU {fmt.pct(r['device_mfu'])} · HFU {fmt.pct(r['hfu'])}",
            )
        )
    s = {
        "cards": cards(items),
        "warnings": warnings_list(said),
        "rank_legend": legend(PART_COLORS, PART_LABELS),
        "rank_bars": stacked_rows_svg(rows, PART_COLORS, PART_LABELS, css_class="ranks"),
        "ranks": table(
            ["rank", "trace", "wall", "device MFU", "HFU", "executed FLOPs", "recompute FLOPs"],
            [
                [
                    r["rank"],
                    r["path"],
                    fmt.ms(r["wall_us"]),
                    fmt.pct(r["device_mfu"]),
                    fmt.pct(r["hfu"]),
                    fmt.si(r["executed_flops"], "FLOP"),
                    fmt.si(r["recompute_flops"], "FLOP"),
                ]
                for r in job.ranks.iter_rows(named=True)
            ],
            left=(1,),
            name_cols=(1,),
        ),
        "budgets": rank_budgets(job.summaries),
        "steps": None,
        "stragglers": stragglers_table(job.stragglers),
        "collectives": collectives_table(job.collectives),
        "communication": communication_section(job.communication, job.communication_by_rank),
        "experts": None,
        "advice": job_advice_html(job) if job.advice else JOB_ADVICE_NONE,
        "pipeline": None,
    }
    if job.steps is not None and job.steps.height:
        s["steps"] = table(
            ["step", "step time (slowest rank)", "slowest rank", "ranks", "MFU", "HFU"],
            [
                [r["step"], fmt.ms(r["step_us"]), r["slowest_rank"], r["ranks"], fmt.pct(r["mfu"]), fmt.pct(r["hfu"])]
                for r in job.steps.iter_rows(named=True)
            ],
        )
    if job.experts is not None and job.experts.height:
        x = lambda r, k: num("—" if r[k] is None else f"{r[k]:.2f}×", r[k], k)
        s["experts"] = table(
            ["rank", "EP group", "expert FLOPs / step", "vs group mean", "all-to-all / step", "vs group mean"],
            [
                [
                    r["rank"],
                    r["ep_group"] or "?",
                    num(
                        fmt.si(r["expert_flops_per_step"], "FLOP"), r["expert_flops_per_step"], "expert_flops_per_step"
                    ),
                    x(r, "flops_vs_group_mean"),
                    num(fmt.nbytes(r["a2a_bytes_per_step"]), r["a2a_bytes_per_step"], "a2a_bytes_per_step"),
                    x(r, "bytes_vs_group_mean"),
                ]
                for r in job.experts.iter_rows(named=True)
            ],
            left=(1,),
        )
    pipeline = None
    if job.pipeline is not None and job.pipeline.height:
        p = job.pipeline.sort("stage", "rank", "step", nulls_last=True)
        first = p.row(0, named=True)
        pipeline = {
            "stages": "?" if first["stages"] is None else first["stages"],
            "microbatches": "?" if first["microbatches"] is None else first["microbatches"],
            "source": first["stages_source"] or "unknown",
        }
        s["pipeline"] = table(
            [
                "stage",
                "rank",
                "step",
                "blocked on recv",
                "P2P",
                "bubble",
                "ideal bubble",
                "sends",
                "recvs",
                "matched",
                "forward / backward",
            ],
            [
                [
                    r["stage"],
                    r["rank"],
                    r["step"],
                    fmt.ms(r["recv_blocked_us"]),
                    fmt.ms(r["p2p_us"]),
                    fmt.pct(r["bubble"]),
                    fmt.pct(r["ideal_bubble"]),
                    r["sends"],
                    r["recvs"],
                    r["matched"],
                    f"{r['forward_p2p']} / {r['backward_p2p']}",
                ]
                for r in p.iter_rows(named=True)
            ],
        )
    return page(title, [str(macros("job.html").report(title, len(said), s, pipeline))])
