"""`ipledger findings | finding confirm|dismiss | explain | ask | analyze`: the agents from the command line.

Each command is a thin layer over one library call in :mod:`ledger.agents` (docs/agents.md).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import click

from ..base.progressbar import Progress
from ..base.textsafe import echo
from .context import AppContext, UserError, emit_json, pass_app, reads_only


def _since(value: str | None) -> float | None:
    if value is None:
        return None
    from ..chain.canonical import ts_to_epoch

    v = value.strip()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        v += "T00:00:00Z"
    try:
        return ts_to_epoch(v)
    except ValueError:
        raise UserError(f"--since: cannot read {value!r} (want YYYY-MM-DD or RFC 3339 with a zone)") from None


def _print_finding(f: dict, status: str | None = None) -> None:
    sc = f["scope"]
    where = ", ".join(f"{k}={v}" for k, v in sc.items() if v)
    st = f" [{status}]" if status else ""
    echo(f"{f['id']}  {f['agent']}/{f['kind']}{st}  {f['gpu_hours']:.2f} GPU-h  conf {f['confidence']:.2f}  "
               f"{f['start']} .. {f['end']}  ({where})")
    echo(f"    {f['summary']}")
    if f.get("command"):
        echo(f"    could run (not run): {f['command']}")


SAMPLES_HELP = "Read every sample (the full-resolution reference) instead of the device-hours."
NO_CACHE_HELP = ("Build the agents' dataset from the sealed data, not from the checked cache beside the ledger "
                 "(the same answer; docs/agents.md).")


def _dataset(app: AppContext, from_samples: bool, use_cache: bool = True, write_cache: bool = False):  # noqa: ANN202
    """The agents' dataset and its causes (None: not worked out yet): device-hours with the raw samples of what the
    agents find (docs/scale.md), from the ledger's cache when it is sound (ledger.agents.dataset_cache; written
    only by a command that writes the ledger, ``write_cache``); or every sample, with no cache."""
    from .. import agents
    from ..chain.db import sqlite_path

    engine = app.engine()
    if from_samples:
        return agents.load(engine), None
    from ..agents import dataset_cache

    ledger_file = sqlite_path(app.db_url) if use_cache else None
    got = dataset_cache.load(engine, dataset_cache.cache_path(ledger_file) if ledger_file else None,
                             write=write_cache)
    return got.dataset, got.causes


@click.command("findings")
@click.option("--since", help="Only findings whose window ends at or after this (YYYY-MM-DD or RFC 3339).")
@click.option("--refresh/--no-refresh", default=True, show_default=True,
              help="Run the agents over the ledger first and record new findings (finding_recorded entries).")
@click.option("--samples", "from_samples", is_flag=True, help=SAMPLES_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the Findings JSON (docs/agents.md).")
@click.option("--no-cache", "no_cache", is_flag=True, help=NO_CACHE_HELP)
@pass_app
@reads_only("refresh")
def findings_cmd(app: AppContext, since: str | None, refresh: bool, from_samples: bool, as_json: bool,
                 no_cache: bool) -> None:
    """List the agents' findings over the ledger, with operators' verdicts.

    The agents read the device-hours sealed with the telemetry, and raw samples only for the scopes and
    windows of what they find (memory grows with devices x hours; docs/scale.md); --samples reads every sample.
    A refresh also writes the checked cache of the agents' dataset beside an SQLite ledger, which the next
    `findings`, `ask`, `explain` and `account` read instead of rebuilding it (--no-cache: rebuild).

    \b
    Example:
      ipledger findings
      ipledger findings --since 2026-11-05 --json
      ipledger findings --no-refresh
      ipledger findings --samples          # the full-resolution reference
      ipledger findings --no-cache         # rebuild the dataset from the sealed data
    """
    from .. import agents

    t = _since(since)
    engine = app.engine()
    account = None
    if refresh:
        with Progress("findings", quiet=as_json, steps=2) as bar:
            bar.step("run the agents")
            ds, causes = _dataset(app, from_samples, use_cache=not no_cache, write_cache=True)
            if as_json:   # the account is printed only with the JSON
                analysis = agents.run_agents(ds, causes)
                found, account = analysis.findings, analysis.account
            else:
                found = agents.find(ds, causes)
            bar.step("record")
            agents.record(engine, found)
    rows = agents.recorded_findings(engine, since=t)
    if refresh:  # show what the agents find now (older recorded windows stay in the ledger, not in this list)
        current = {f.id for f in found}
        rows = [r for r in rows if r["id"] in current]
    if as_json:
        emit_json({"findings": rows, "account": account if account is not None else {},
                   "source": ("samples" if from_samples else "device_hours") if refresh else "recorded"})
        return
    if not rows:
        echo("no findings")
    for r in rows:
        _print_finding(r, r["status"]["status"])


@click.group("finding")
def finding_group() -> None:
    """Confirm or dismiss a recorded finding (an operator's verdict, recorded as a ledger entry).

    \b
    Example:
      ipledger finding confirm F1a2b3c4d5e6f7a8 --by alice --note "CRAH-3 fan failed"
      ipledger finding dismiss F1a2b3c4d5e6f7a8 --by bob --note "planned power test"
    """


def _verdict(app: AppContext, finding_id: str, confirm: bool, by: str, note: str, as_json: bool) -> None:
    from .. import agents

    try:
        res = agents.verdict(app.engine(), finding_id, confirm, by, note)
    except agents.UnknownFinding as exc:
        raise UserError(str(exc)) from None
    word = "confirmed" if confirm else "dismissed"
    if as_json:
        emit_json({"finding_id": finding_id, "status": word, "by": by, "note": note, "seq": res.last_seq})
    else:
        echo(f"{finding_id} {word} by {by} (ledger seq {res.last_seq})")


@finding_group.command("confirm")
@click.argument("finding_id")
@click.option("--by", required=True, help="Who confirms (operator name).")
@click.option("--note", default="", help="Why.")
@click.option("--json", "as_json", is_flag=True)
@pass_app
def confirm_cmd(app: AppContext, finding_id: str, by: str, note: str, as_json: bool) -> None:
    """Confirm a finding: recommendations use confirmed findings first.

    \b
    Example:
      ipledger finding confirm F1a2b3c4d5e6f7a8 --by alice --note "CRAH-3 fan failed"
    """
    _verdict(app, finding_id, True, by, note, as_json)


@finding_group.command("dismiss")
@click.argument("finding_id")
@click.option("--by", required=True, help="Who dismisses (operator name).")
@click.option("--note", default="", help="Why.")
@click.option("--json", "as_json", is_flag=True)
@pass_app
def dismiss_cmd(app: AppContext, finding_id: str, by: str, note: str, as_json: bool) -> None:
    """Dismiss a finding: it yields no recommendation any more.

    \b
    Example:
      ipledger finding dismiss F1a2b3c4d5e6f7a8 --by bob --note "planned power test"
    """
    _verdict(app, finding_id, False, by, note, as_json)


def _print_explain(ex: dict) -> None:
    echo(ex["answer"])
    t, a = ex["table"], ex["account"]
    echo(f"  paid {t['paid']:,.1f}  delivered {t['delivered']:,.1f}  lost {t['lost']:,.1f} GPU-h  "
               f"({a['cost']['lost']:,.2f} {a['currency']} lost)")
    for ln in t["lines"]:
        echo(f"    {ln['cause']:32s} {ln['gpu_hours']:10,.1f} GPU-h")
    if "currency" not in ex:
        ex = dict(ex, currency=a["currency"])
    _print_basis(ex)
    for f in ex["findings"]:
        echo(f"  - {f['id']} {f['kind']} ({f['gpu_hours_in_scope']:.1f} GPU-h here): {f['summary']}")
        for e in f["evidence"][:3]:
            echo(f"      {e['signal']}: before {e['before']}  during {e['during']}  after {e['after']}"
                       + (f"  ({e.get('reference_label')}: {e.get('reference')})" if e.get("reference") is not None
                          else ""))
    for r in ex.get("recommendations", []):
        echo(f"  next step: {r['summary']}")
    if ex.get("timeline"):
        echo("  timeline:")
        for t in ex["timeline"]:
            echo(f"    {t['t']}  run {t['run']}  {t['event']:<22} {t['detail']}")


@click.command("explain")
@click.option("--node")
@click.option("--rack")
@click.option("--tenant")
@click.option("--job")
@click.option("--period", default="all", show_default=True,
              help="2026-W45, 2026-11-03, 2026-11, 2026-11-02..2026-11-05, this-week, last-week, today, yesterday.")
@click.option("--samples", "from_samples", is_flag=True, help=SAMPLES_HELP)
@click.option("--json", "as_json", is_flag=True)
@click.option("--no-cache", "no_cache", is_flag=True, help=NO_CACHE_HELP)
@pass_app
@reads_only()
def explain_cmd(app: AppContext, node: str | None, rack: str | None, tenant: str | None, job: str | None,
                period: str, from_samples: bool, as_json: bool, no_cache: bool) -> None:
    """Where the GPU-hours of a node, rack, tenant or job went in a period, by cause, with evidence.

    Read from the device-hours and the raw samples of what the agents find; --samples reads every sample.

    \b
    Example:
      ipledger explain --node D2 --period 2026-W45
      ipledger explain --rack R3 --period this-week --json
      ipledger explain --tenant climate --period 2026-11
      ipledger explain --job 4242          # with the job's timeline: runs, progress marks, lost work
      ipledger explain --rack R3 --no-cache   # rebuild the dataset from the sealed data
    """
    from .. import agents
    from ..agents import query
    from ..agents.accounting import ExplainError, scope_masks

    given = [(k, v) for k, v in (("node", node), ("rack", rack), ("tenant", tenant), ("job", job)) if v]
    if len(given) != 1:
        raise UserError("give exactly one of --node, --rack, --tenant, --job")
    kind, name = given[0]
    with Progress("explain", quiet=as_json, steps=3) as bar:
        (ds, causes), (start, end, _) = _dataset_in(app, from_samples, period, bar, "explain", not no_cache)
        try:
            scope_masks(ds, kind, name)  # an unknown scope is refused before the agents run
            bar.step("run the agents")
            found = agents.find(ds, causes)
            bar.step("explain")
            ex = query.scope(ds, found, kind, name, start, end, _billed(app, start, end))
        except ExplainError as exc:
            raise UserError(str(exc).strip("'\"")) from None
    if as_json:
        emit_json(ex)
    else:
        _print_explain(ex)


@click.command("ask")
@click.argument("question")
@click.option("--samples", "from_samples", is_flag=True, help=SAMPLES_HELP)
@click.option("--json", "as_json", is_flag=True)
@click.option("--no-cache", "no_cache", is_flag=True, help=NO_CACHE_HELP)
@pass_app
@reads_only()
def ask_cmd(app: AppContext, question: str, from_samples: bool, as_json: bool, no_cache: bool) -> None:
    """Answer a question about where GPU-hours went (a small grammar, docs/agents.md); refuses anything else.

    Read from the device-hours and the raw samples of what the agents find; --samples reads every sample.

    \b
    Example:
      ipledger ask "why did D2 lose 400 GPU-hours this week?"
      ipledger ask "how many GPU-hours did tenant climate lose in 2026-W45?"
      ipledger ask "where did the GPU-hours go yesterday?"
      ipledger ask "what happened on rack R3 on 2026-11-04?"
      ipledger ask "which jobs wasted the most GPU-hours this week?"
      ipledger ask "which tenants got the most math per GPU-hour in 2026-11?"
      ipledger ask "how much did cooling cost us this week?"
      ipledger ask "what was the utilization of R3 on Wednesday?"
      ipledger ask "why is B2 slow?"
      ipledger ask "why is B2 slow?" --no-cache   # rebuild the dataset from the sealed data
    """
    from .. import agents
    from ..agents.ask import CannotAnswer, answer, parse_question, prepare

    try:
        parse_question(question)  # refuse before touching the database
        with Progress("ask", quiet=as_json, steps=2) as bar:
            bar.step("read the ledger")
            ds, causes = _dataset(app, from_samples, use_cache=not no_cache)

            def findings():  # noqa: ANN202 - run only for the questions that need them
                bar.step("run the agents")
                return agents.find(ds, causes)

            prepared = prepare(ds, question)
            form, start, end = prepared[0].form, prepared[3], prepared[4]
            if form == "math":
                from ..agents.query import billed_statement

                res = answer(ds, findings, question, prepared, statement=billed_statement(app.engine(), start, end))
            else:
                res = answer(ds, findings, question, prepared, _billed(app, start, end) if form != "rank" else None)
    except CannotAnswer as exc:
        raise UserError(str(exc)) from None
    if as_json:
        emit_json(res)
    elif res["form"] == "rank":
        echo(res["answer"])
        by = res["by"]
        echo(f"  {by:24s} {'paid':>10s} {'delivered':>10s} {'lost':>10s}  GPU-h")
        for r in res["ranking"]:
            echo(f"  {r[by]:24s} {r['paid']:10,.1f} {r['delivered']:10,.1f} {r['lost']:10,.1f}")
    elif res["form"] == "math":
        echo(res["answer"])
        echo(f"  {'tenant':24s} {'paid GPU-h':>11s} {'achieved PFLOP-h':>17s} {'per GPU-h':>10s} {'rated share':>12s}")
        for r in res["ranking"]:
            per, share = r["pflop_hours_per_paid_gpu_hour"], r["rated_share"]
            echo(f"  {str(r['tenant']):24s} {r['paid']:11,.1f} {r['achieved_pflop_hours']:17,.4f} "
                 f"{'unknown' if per is None else format(per, ',.4f'):>10s} "
                 f"{'unknown' if share is None else format(share, '.1%'):>12s}")
    else:
        _print_explain(res)


def _period_with_data(ds, text: str) -> tuple[float, float, str]:  # noqa: ANN001 - an agents dataset
    """``[start, end)`` and label of a period (a day, a week...) the ledger holds data in; else a one-line
    UserError."""
    from ..agents.ask import BadPeriod, parse_period

    try:
        start, end, label = parse_period(text, ds.start, ds.end)
    except BadPeriod as exc:
        raise UserError(str(exc)) from None
    if end <= ds.start or start >= ds.end:
        raise UserError(f"the ledger has no data in {label}")
    return start, end, label


def _dataset_in(app: AppContext, from_samples: bool, period: str, bar: Progress, what: str,  # noqa: ANN202
                use_cache: bool = True):
    """The agents' dataset and causes (:func:`_dataset`, a step of ``bar``) and the period it holds data in;
    one-line errors otherwise."""
    bar.step("read the ledger")
    ds, causes = _dataset(app, from_samples, use_cache=use_cache)
    if not len(ds.allocs) and not len(ds.samples):
        raise UserError(f"the ledger holds no allocations or telemetry to {what}")
    return (ds, causes), _period_with_data(ds, period)


def _billed(app: AppContext, start: float, end: float):  # noqa: ANN202 - statement rows or None
    """The month's statement rows when [start, end) is a calendar month with issued receipts (the receipts basis
    of :mod:`ledger.agents.query`), else None (device-hours)."""
    from ..agents.query import billed_rows

    return billed_rows(app.engine(), start, end)


def _print_basis(res: dict) -> None:
    """The billed figures and the named lines between them and the device-hours, when the period is billed."""
    if res.get("basis") != "receipts":
        if res.get("basis_note"):
            echo(f"  basis: {res['basis_note']}")
        return
    b = res["billed"]
    echo(f"  {'billed (issued receipts)':40s} {b['paid']:12,.4f} {b['delivered']:12,.4f} GPU-h  "
               f"{b['cost']['paid']:12,.2f} {b['cost']['delivered']:12,.2f} {res['currency']}")
    for ln in res.get("differences", []):
        echo(f"  + {ln['line']:38s} {ln['paid']:12,.4f} {ln['delivered']:12,.4f} GPU-h  "
                   f"{ln['cost']['paid']:12,.2f} {ln['cost']['delivered']:12,.2f} {res['currency']}")
    ec = b.get("effective_compute")
    if ec is not None:
        per = f"{ec['achieved_pflop_hours'] / b['paid']:,.4f}" if b["paid"] and ec["lens_unmeasured_gpu_hours"] < \
            b["paid"] else "unknown"
        echo(f"  effective compute (issued receipts): {ec['achieved_pflop_hours']:,.4f} of "
             f"{ec['rated_pflop_hours']:,.4f} rated PFLOP-h, {per} PFLOP-h per paid GPU-h, "
             f"{ec['lens_unmeasured_gpu_hours']:,.4f} GPU-h not measured by the lens")
    a = res["account"]
    echo(f"  = {'device-hours (paid, delivered)':38s} {a['paid']:12,.4f} {a['delivered']:12,.4f} GPU-h  "
               f"{a['cost']['paid']:12,.2f} {a['cost']['delivered']:12,.2f} {res['currency']}")


_ACCOUNT_PERIODS = (("--day", r"\d{4}-\d{2}-\d{2}|today|yesterday", "2026-11-04, today or yesterday"),
                    ("--week", r"\d{4}-[wW]\d{1,2}|this-week|last-week", "2026-W45, this-week or last-week"))


@click.command("account")
@click.option("--day", help="A UTC day: 2026-11-04, today, yesterday.")
@click.option("--week", help="An ISO week: 2026-W45, this-week, last-week.")
@click.option("--period", help="Any period: 2026-11 (a billed month also shows its receipts), 2026-11-02..2026-11-05, "
                               "all (the default).")
@click.option("--samples", "from_samples", is_flag=True, help=SAMPLES_HELP)
@click.option("--json", "as_json", is_flag=True)
@click.option("--no-cache", "no_cache", is_flag=True, help=NO_CACHE_HELP)
@pass_app
@reads_only()
def account_cmd(app: AppContext, day: str | None, week: str | None, period: str | None, from_samples: bool,
                as_json: bool, no_cache: bool) -> None:
    """The account of a period (`daily` is the same command): paid, delivered and lost GPU-hours per tenant and per
    day, totals, the loss by cause, and on a billed month the receipts' figures with the lines between them.

    Read from the device-hours and the raw samples of what the agents find; --samples reads every sample. Every
    figure is the one `explain`, `ask`, the statement and `report analysis` give for the same question
    (ledger.agents.query).

    \b
    Example:
      ipledger account --day 2026-11-04
      ipledger account --week 2026-W45 --json
      ipledger account --period 2026-11
      ipledger daily                       # the same command: every day of the ledger
      ipledger account --no-cache          # rebuild the dataset from the sealed data
    """
    from .. import agents
    from ..agents import query

    given = [(o, v) for o, v in (("--day", day), ("--week", week), ("--period", period)) if v]
    if len(given) > 1:
        raise UserError("give at most one of --day, --week, --period")
    for opt, pattern, want in _ACCOUNT_PERIODS:
        v = day if opt == "--day" else week
        if v and not re.fullmatch(pattern, v.strip()):
            raise UserError(f"{opt}: cannot read {v!r} (want {want})")
    with Progress("account", quiet=as_json, steps=3) as bar:
        bar.step("read the ledger")
        ds, causes = _dataset(app, from_samples, use_cache=not no_cache)
        if not len(ds.allocs):
            raise UserError("the ledger holds no allocations to account for")
        start, end, label = _period_with_data(ds, given[0][1] if given else "all")
        bar.step("run the agents")
        found = agents.find(ds, causes)
        bar.step("account")
        res = query.period(ds, found, start, end, label, _billed(app, start, end))
    res["source"] = "samples" if from_samples else "device_hours"
    if as_json:
        emit_json(res)
        return
    _print_account(res)


def _print_account(res: dict) -> None:
    echo(res["answer"])
    if len({r["day"] for r in res["daily"]}) > 1:
        echo(f"  {'day':10s} {'tenant':16s} {'partition':12s} {'paid':>10s} {'delivered':>10s} {'unknown':>9s}"
             "  GPU-h")
        for r in res["daily"]:
            echo(f"  {r['day']:10s} {r['tenant']:16s} {r['partition']:12s} {r['paid']:10,.1f} "
                 f"{r['delivered']:10,.1f} {r['unknown']:9,.1f}")
    echo(f"  {'tenant':24s} {'paid':>10s} {'delivered':>10s} {'lost':>10s}  GPU-h")
    for r in res["tenants"]:
        echo(f"  {str(r['tenant']):24s} {r['paid']:10,.1f} {r['delivered']:10,.1f} {r['lost']:10,.1f}")
    t = res["total"]
    echo(f"  {'total':24s} {t['paid']:10,.1f} {t['delivered']:10,.1f} {t['lost']:10,.1f}")
    echo("  lost by cause:")
    for ln in res["table"]["lines"]:
        echo(f"    {ln['cause']:32s} {ln['gpu_hours']:10,.1f} GPU-h")
    echo(f"  cost: paid {res['cost']['paid']:,.2f}  delivered {res['cost']['delivered']:,.2f}  "
               f"lost {res['cost']['lost']:,.2f} {res['currency']}")
    _print_basis(res)


@click.group("report")
def report_group() -> None:
    """Written reports built from the ledger."""


@report_group.command("analysis")
@click.option("--period", default="all", show_default=True,
              help="2026-W45, 2026-11-03, 2026-11, 2026-11-02..2026-11-05, this-week, last-week, today, yesterday.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="The PDF to write.")
@click.option("--json", "as_json", is_flag=True, help="Also print the analysis JSON the PDF was made from.")
@click.option("--samples", "from_samples", is_flag=True, help=SAMPLES_HELP)
@pass_app
@reads_only()
def report_analysis_cmd(app: AppContext, period: str, out: str, as_json: bool, from_samples: bool) -> None:
    """The written analysis (PDF) of a period of the ledger: its account, findings and recommendations.

    Read from the device-hours and the raw samples of what the agents find; --samples reads every sample.

    \b
    Example:
      ipledger report analysis --period 2026-W45 --out analysis-w45.pdf
    """
    from .. import agents
    from ..agents.export_analysis import AnalysisError

    with Progress("report analysis", quiet=as_json, steps=4) as bar:
        (ds, causes), (start, end, label) = _dataset_in(app, from_samples, period, bar, "analyse")
        bar.step("run the agents")
        analysis = agents.run_agents(ds, causes)
        bar.step("analyse")
        doc = agents.period_analysis(ds, analysis, start, end, label)
        from ..agents.export_analysis import finding_series

        kept = {x["id"] for x in doc["findings"]}
        doc["series"] = finding_series(ds, [f for f in analysis.findings if f.id in kept])
        from reports import analysis_pdf

        bar.step("write the PDF")
        try:
            analysis_pdf.render(doc, Path(out))
        except (OSError, AnalysisError) as exc:
            raise UserError(f"{out}: {exc}") from None
    if as_json:
        emit_json(doc)
    else:
        echo(f"written analysis of {label}: {out}")


@click.command("analyze")
@click.argument("source", nargs=-1, type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["prometheus", "dmon", "amd-smi", "nvidia-smi"]),
              default=None, help="What every SOURCE file is (default: each file's format is read from its first lines).")
@click.option("--node-from", "node_from", metavar="REGEX",
              help="Captures: the node of each file from its name (the group 'node', else the first group); "
                   "default: the name after dmon-/amdsmi-/nvsmi-, e.g. dmon-gpu-07.txt -> gpu-07 "
                   "(a file's '# ipledger-start ... node=NAME' line wins).")
@click.option("--url", help="Live Prometheus base URL instead of files (GET query_range only).")
@click.option("--start", help="Live / captures: start (epoch or RFC 3339).")
@click.option("--end", help="Live: end (epoch or RFC 3339).")
@click.option("--step", "--interval", "step",
              help="Live: query step (default 15s); captures: the sampling interval (--interval, as `import` says it).")
@click.option("--node", help="Captures: the host the capture was taken on (one capture file only).")
@click.option("--json", "as_json", is_flag=True, help="Print the Findings JSON (docs/agents.md) of the analysis.")
@click.option("--pdf", "pdf", type=click.Path(dir_okay=False), help="Write the written analysis PDF here.")
@click.option("--keep-ledger", type=click.Path(dir_okay=False),
              help="Also import the export into a SQLite ledger at this path (the agents then read it back; "
                   "the same analysis). Without it no ledger is written.")
@click.option("--samples/--device-hours", "from_samples", default=None,
              help="Read every sample (the full-resolution reference), or the device-hours with the samples "
                   "the findings need; default: every sample while the per-sample frame stays under 256 MiB "
                   "(about 700,000 samples), else the device-hours. The same analysis either way.")
@click.option("--rate", "rate", type=click.FloatRange(min=0.0), metavar="PRICE",
              help="The price of one GPU-hour: the written analysis is then priced at it (without it, it is in "
                   "GPU-hours and says so). E.g. --rate 2.49 --currency USD.")
@click.option("--currency", default=None, metavar="CUR", help="The currency of --rate (e.g. USD, EUR).")
def analyze_cmd(source: tuple[str, ...], fmt: str | None, node_from: str | None, url: str | None,
                start: str | None, end: str | None, step: str | None, node: str | None, as_json: bool,
                pdf: str | None, keep_ledger: str | None, from_samples: bool | None, rate: float | None,
                currency: str | None) -> None:
    """an export analysed in one shot: run every agent over a telemetry export or a capture set (several files,
    a directory or a .tar/.tar.gz/.zip of per-node dmon / amd-smi / nvidia-smi / Prometheus files, mixed is fine:
    all nodes in one analysis; an archive member that fails is quarantined and named, the rest analysed).
    Nothing is written unless --keep-ledger.

    \b
    Example:
      ipledger analyze demo-out/prometheus-export.json --json
      ipledger analyze dcgm-24h.tar.gz --pdf analysis.pdf
      ipledger analyze dcgm-24h.tar.gz --pdf analysis.pdf --rate 2.49 --currency USD   # priced at 2.49 USD/GPU-h
      ipledger analyze captures/                       # dmon-NODE.txt, amdsmi-NODE.csv ... one file per node
      ipledger analyze captures.tar.gz --json          # the same set as an archive
      ipledger analyze dmon-*.txt --node-from 'dmon-(?P<node>[^.]+)' --json
      ipledger analyze captures/ --device-hours --json # over device-hours, whatever the size
      ipledger analyze --url http://127.0.0.1:9090 --start 2026-11-03T00:00:00Z --end 2026-11-04T00:00:00Z --step 60s
    """
    import importlib

    from ..base.heap import free_large_blocks_at_once, keep_large_blocks_in_heap
    from ..importers.exports import AnalysisError, read_source
    from ..base.safeout import OutputError, output_file
    from .importers import parse_duration, parse_time

    free_large_blocks_at_once()   # one command, one process: its peak is the figure docs/performance.md holds
    if rate is not None and not math.isfinite(rate):
        raise UserError(f"--rate: {rate} is not a price")
    if currency is not None and rate is None:
        raise UserError("--currency: give the price too (--rate PRICE)")
    if currency is not None and not (1 <= len(currency) <= 8 and currency.isalpha()):
        raise UserError(f"--currency: {currency!r} is not a currency code (letters, e.g. USD)")

    def import_agents() -> None:   # while worker processes parse the files (the agents and pandas take ~1 s)
        importlib.import_module("ledger.agents.export_analysis")

    try:
        if url:
            if source:
                raise UserError("give either SOURCE files or --url, not both")
            t0, t1 = parse_time(start, "--start"), parse_time(end, "--end")
            if t0 is None or t1 is None:
                raise UserError("--url needs --start and --end")
            from ..importers import prometheus
            from ..importers.common import InputError
            try:
                collected = prometheus.fetch(url, t0, t1, parse_duration(step, "--step") or 15.0)
            except InputError as exc:
                raise UserError(str(exc)) from None
        else:
            if not source:
                raise UserError("give SOURCE files/directories/archives, or --url")
            collected = read_source(fmt, list(source), start=parse_time(start, "--start"),
                                    interval=parse_duration(step, "--interval"), node=node, node_from=node_from,
                                    while_reading=import_agents)
        from ..agents.export_analysis import analyze_collected, reads_every_sample, render_pdf

        if from_samples is not False and keep_ledger is None and reads_every_sample(collected):
            keep_large_blocks_in_heap()   # a small export: its memory is not the concern, page faults are
        analysis = analyze_collected(collected, keep=Path(keep_ledger) if keep_ledger else None,
                                     sources=list(source), consume=True, samples=from_samples)
        if rate is not None:
            analysis.context["rate"] = {"price": rate, "currency": (currency or "").upper()}
        if pdf:
            with output_file(pdf) as tmp:
                render_pdf(analysis, tmp)
    except (AnalysisError, OutputError) as exc:
        raise UserError(str(exc)) from None
    if as_json:
        emit_json(analysis.to_json())
        return
    for q in collected.quarantined:   # archive members left out (also in the JSON's import.quarantined)
        echo(f"warning: quarantined, not analysed: {q}", err=True)
    a = analysis.account
    m = analysis.meta
    echo(f"analysed {m['devices']} devices, {m['samples']} samples, {m['start']} .. {m['end']}: paid "
               f"{a['paid']:.1f} GPU-h, delivered {a['delivered']:.1f}, lost {a['lost']:.1f}")
    for f in analysis.findings:
        _print_finding(f.to_json())
    if pdf:
        echo(f"written analysis: {pdf}")


def register(cli: click.Group) -> None:
    for cmd in (findings_cmd, finding_group, explain_cmd, ask_cmd, account_cmd, analyze_cmd, report_group):
        cli.add_command(cmd)
    cli.add_command(account_cmd, name="daily")   # one command, two names: the same output
