"""Periods and the small question grammar of ``ipledger ask`` (docs/agents.md, "Questions").

Questions (case-insensitive; a trailing "?" is optional)::

    why did SCOPE lose [N | so much] [GPU-hours] [PERIOD]
    why is SCOPE slow [PERIOD]
    how many GPU-hours did SCOPE (lose|deliver|pay for) [PERIOD]       SCOPE may be "the cluster", "the fleet", "we"
    where did the GPU-hours go [PERIOD]
    what happened (on|to|in) SCOPE [PERIOD]
    which (jobs|tenants|nodes|racks) (lost|wasted|delivered|paid for) the most [GPU-hours] [PERIOD]
    which tenants got the most math per GPU-hour [in YYYY-MM]          from the month's statement (the lens)
    how much did (CAUSE|SCOPE) cost [us] [PERIOD]                      CAUSE: cooling, power cap, idle held, ...
    what was the utili[sz]ation of SCOPE [PERIOD]

    SCOPE  := (node|rack|tenant|job) NAME | NAME        (a bare NAME must match exactly one node, rack, tenant or job)
    PERIOD := this week | last week | today | yesterday | on YYYY-MM-DD | on MONDAY..SUNDAY | in|during YYYY-Www
              | in YYYY-MM | between YYYY-MM-DD and YYYY-MM-DD | in the last N days

Relative periods are relative to the ledger's latest data instant (so an answer is reproducible), weeks are ISO
weeks (Monday 00:00 UTC); a weekday is that day of the latest data's week (the week before when it lies after
the data). Anything else is refused with what can be asked: :class:`CannotAnswer`.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass

from ..base.periods import calendar_month, month_of

UTC = _dt.timezone.utc
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
CAUSES = {"cooling": "cooling", "the cooling": "cooling", "power caps": "power_cap", "power cap": "power_cap",
          "the power cap": "power_cap", "idle held gpus": "idle_held", "idle held": "idle_held", "idle gpus": "idle_held",
          "idle time": "idle_held", "starvation": "starved", "starved jobs": "starved", "checkpoints": "checkpoint_starved",
          "checkpointing": "checkpoint_starved", "drift": "drift", "xids": "xid", "xid": "xid", "xid errors": "xid",
          "unknown time": "unknown (no finding)", "underutilization": "underutilized (workload)"}
FLEET_WORDS = ("the cluster", "the fleet", "we", "everyone", "all jobs", "the hall", "our gpus", "the gpus")


class CannotAnswer(ValueError):
    pass


class BadPeriod(ValueError):
    pass


def _day(s: str) -> _dt.datetime:
    try:
        return _dt.datetime.strptime(s, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise BadPeriod(f"bad date {s!r} (want YYYY-MM-DD)") from None


def _week_start(d: _dt.datetime) -> _dt.datetime:
    d = d.replace(hour=0, minute=0, second=0, microsecond=0)
    return d - _dt.timedelta(days=d.weekday())


def parse_period(text: str | None, data_start: float, data_end: float) -> tuple[float, float, str]:
    """(start, end, label) for a period expression (also the forms `explain --period` takes)."""
    if text is None or text.strip().lower() in ("", "all", "everything"):
        return data_start, data_end, "all data"
    t = text.strip().lower().replace("_", " ").replace("-week", " week")
    last = _dt.datetime.fromtimestamp(max(data_end - 1, data_start), tz=UTC)
    today = last.replace(hour=0, minute=0, second=0, microsecond=0)
    if t == "this week":
        a = _week_start(last)
        return a.timestamp(), (a + _dt.timedelta(days=7)).timestamp(), f"week {a.strftime('%G-W%V')}"
    if t == "last week":
        a = _week_start(last) - _dt.timedelta(days=7)
        return a.timestamp(), (a + _dt.timedelta(days=7)).timestamp(), f"week {a.strftime('%G-W%V')}"
    if t == "today":
        return today.timestamp(), (today + _dt.timedelta(days=1)).timestamp(), today.strftime("%Y-%m-%d")
    if t == "yesterday":
        a = today - _dt.timedelta(days=1)
        return a.timestamp(), today.timestamp(), a.strftime("%Y-%m-%d")
    wd = re.sub(r"^on ", "", t)
    if wd in WEEKDAYS:
        a = _week_start(last) + _dt.timedelta(days=WEEKDAYS.index(wd))
        if a > today:
            a -= _dt.timedelta(days=7)
        return a.timestamp(), (a + _dt.timedelta(days=1)).timestamp(), f"{wd.capitalize()} {a.strftime('%Y-%m-%d')}"
    m = re.fullmatch(r"(?:in )?the last (\d+) days?", t)
    if m:
        a = last - _dt.timedelta(days=int(m.group(1)))
        return a.timestamp(), data_end, f"the last {m.group(1)} days"
    t = re.sub(r"^(on|in|during) ", "", t)
    m = re.fullmatch(r"(\d{4})-w(\d{1,2})", t)
    if m:
        try:
            a = _dt.datetime.fromisocalendar(int(m.group(1)), int(m.group(2)), 1).replace(tzinfo=UTC)
        except ValueError:
            raise BadPeriod(f"bad ISO week {text!r}") from None
        return a.timestamp(), (a + _dt.timedelta(days=7)).timestamp(), f"week {m.group(1)}-W{int(m.group(2)):02d}"
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", t):
        a = _day(t)
        return a.timestamp(), (a + _dt.timedelta(days=1)).timestamp(), t
    m = re.fullmatch(r"(\d{4})-(\d{2})", t)
    if m:
        y, mo = int(m.group(1)), int(m.group(2))
        if not 1 <= mo <= 12:
            raise BadPeriod(f"bad month {text!r}")
        a = _dt.datetime(y, mo, 1, tzinfo=UTC)
        b = _dt.datetime(y + (mo == 12), mo % 12 + 1, 1, tzinfo=UTC)
        return a.timestamp(), b.timestamp(), t
    m = re.fullmatch(r"(?:between )?(\d{4}-\d{2}-\d{2})(?:\.\.| and )(\d{4}-\d{2}-\d{2})", t)
    if m:
        a, b = _day(m.group(1)), _day(m.group(2)) + _dt.timedelta(days=1)
        if b <= a:
            raise BadPeriod(f"period {text!r} ends before it starts")
        return a.timestamp(), b.timestamp(), f"{m.group(1)} to {m.group(2)}"
    raise BadPeriod(f"cannot read period {text!r} (try 2026-W45, 2026-11-03, 2026-11, "
                    f"2026-11-02..2026-11-05, this week, last week, today, yesterday)")


REFUSAL = ("I can't answer that. I can answer: why did SCOPE lose [N] GPU-hours [PERIOD]; why is SCOPE slow "
           "[PERIOD]; how many GPU-hours did SCOPE|the cluster lose|deliver|pay for [PERIOD]; where did the GPU-hours go "
           "[PERIOD]; what happened on SCOPE [PERIOD]; which jobs|tenants|nodes|racks lost|delivered the most "
           "GPU-hours [PERIOD]; which tenants got the most math per GPU-hour [in YYYY-MM]; how much did "
           "cooling|power cap|idle held|SCOPE cost us [PERIOD]; what was the "
           "utilization of SCOPE [PERIOD]. SCOPE is node|rack|tenant|job NAME; PERIOD e.g. this week, yesterday, "
           "on wednesday, on 2026-11-04, in 2026-W45 (docs/agents.md)")


@dataclass(frozen=True)
class Question:
    form: str             # why | how_many | where | what
    scope_kind: str       # node | rack | tenant | job | fleet
    name: str | None
    period: str | None
    verb: str | None = None
    claimed: float | None = None


_PERIOD = (r"(?P<period>this week|last week|today|yesterday|(?:on|in|during) \d{4}-w\d{1,2}|(?:on|in|during) "
           r"\d{4}-\d{2}-\d{2}|in \d{4}-\d{2}|between \d{4}-\d{2}-\d{2} and \d{4}-\d{2}-\d{2}|in the last \d+ days?"
           r"|on (?:" + "|".join(WEEKDAYS) + r"))")
_SCOPE = r"(?:(?P<kind>node|rack|tenant|job) )?(?P<name>[a-z0-9][a-z0-9_.:-]*)"
_HOURS = r"(?:gpu[- ]?hours?|hours?|gpuh)"
_FLEET = r"(?P<fleet>" + "|".join(FLEET_WORDS) + r")"
_ENTITIES = r"(?P<entity>jobs?|tenants?|nodes?|racks?|accounts?)"
FORMS = [
    ("why", re.compile(rf"why did {_SCOPE} (?P<verb>lose|waste)(?: (?P<n>[\d,]+(?:\.\d+)?)| so much| so many| that much)?"
                       rf"(?: {_HOURS})?(?: {_PERIOD})?")),
    ("slow", re.compile(rf"why (?:is|was) {_SCOPE} (?:so )?slow(?:er)?(?: {_PERIOD})?")),
    ("how_many", re.compile(rf"how many {_HOURS} did {_FLEET} (?P<verb>lose|deliver|pay for|waste)(?: {_PERIOD})?")),
    ("how_many", re.compile(rf"how many {_HOURS} did {_SCOPE} (?P<verb>lose|deliver|pay for|waste)(?: {_PERIOD})?")),
    ("math", re.compile(rf"(?:which|what) (?:tenants?|accounts?) (?:got|did|had|used|bought) the most "
                        rf"(?:math|compute|flops?|flop-hours)(?: (?:per|for each|a|each) (?:paid )?{_HOURS})?"
                        rf"(?: {_PERIOD})?")),
    ("rank", re.compile(rf"(?:which|what) {_ENTITIES} (?P<verb>lost|wasted|delivered|paid for|used) the most"
                        rf"(?: {_HOURS})?(?: {_PERIOD})?")),
    ("cost", re.compile(rf"how much did (?P<cause>{'|'.join(sorted(CAUSES, key=len, reverse=True))}) cost(?: us)?"
                        rf"(?: {_PERIOD})?")),
    ("cost", re.compile(rf"how much did {_SCOPE} cost(?: us)?(?: {_PERIOD})?")),
    ("util", re.compile(rf"what (?:was|is) the (?:gpu )?utili[sz]ation (?:of|on|in) {_SCOPE}(?: {_PERIOD})?")),
    ("util", re.compile(rf"what (?:was|is) the (?:gpu )?utili[sz]ation(?: of {_FLEET})?(?: {_PERIOD})?")),
    ("where", re.compile(rf"where did (?:the|our|all the) {_HOURS} go(?: {_PERIOD})?")),
    ("what", re.compile(rf"what happened (?:on|to|in|with) {_SCOPE}(?: {_PERIOD})?")),
]


def parse_question(text: str) -> Question:
    q = " ".join(text.strip().lower().split()).rstrip("?.! ")
    for form, rx in FORMS:
        m = rx.fullmatch(q)
        if not m:
            continue
        g = m.groupdict()
        if g.get("name") in ("the", "our", "it", "we", "they") and not g.get("kind"):
            continue
        n = g.get("n")
        fleet = form in ("where", "rank", "math") or g.get("fleet") is not None or g.get("cause") is not None or \
            (form == "util" and g.get("name") is None)
        return Question(form=form, scope_kind=g.get("kind") or ("fleet" if fleet else "?"),
                        name=None if fleet else g.get("name"), period=g.get("period"),
                        verb=g.get("entity") if form == "rank" else (g.get("verb") or g.get("cause")),
                        claimed=float(n.replace(",", "")) if n else None)
    raise CannotAnswer(REFUSAL)


def resolve_scope(q: Question, nodes: set[str], racks: set[str], tenants: set[str],
                  jobs: set[str]) -> tuple[str, str | None]:
    """Match the question's scope name (case-insensitively) against what the ledger knows."""
    if q.scope_kind == "fleet":
        return "fleet", None
    pools = {"node": nodes, "rack": racks, "tenant": tenants, "job": jobs}
    want = [q.scope_kind] if q.scope_kind in pools else list(pools)
    hits = []
    for kind in want:
        for name in pools[kind]:
            if name is not None and str(name).lower() == q.name:
                hits.append((kind, str(name)))
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise CannotAnswer(f"I can't answer that: I know no {q.scope_kind if q.scope_kind in pools else 'node, rack, '}"
                           f"{'' if q.scope_kind in pools else 'tenant or job'} called {q.name!r}.")
    raise CannotAnswer(f"I can't answer that: {q.name!r} is ambiguous ({', '.join(k for k, _ in hits)}); "
                       f"say e.g. 'node {q.name}'.")


def prepare(ds, text: str) -> tuple:  # noqa: ANN001
    """Parse and resolve a question against the ledger, before any agent runs (cheap refusals)."""
    q = parse_question(text)
    kind, name = resolve_scope(q, set(ds.devices["node"].dropna()), set(ds.devices["rack"].dropna()),
                               set(ds.allocs["tenant"].dropna()), set(ds.allocs["job_id"].dropna()))
    try:
        if q.form == "math" and q.period is None:   # the math is the statement's: the month of the latest data
            start, end, label = parse_period(f"in {month_of(max(ds.end - 1, ds.start))}", ds.start, ds.end)
        else:
            start, end, label = parse_period(q.period, ds.start, ds.end)
    except BadPeriod as exc:
        raise CannotAnswer(f"I can't answer that: {exc}") from None
    if q.form == "math" and calendar_month(start, end) is None:
        raise CannotAnswer(f"I can't answer that: the math per GPU-hour is the monthly statement's (the receipts' "
                           f"effective-compute lens), and {label} is not a calendar month: ask e.g. "
                           f"\"which tenants got the most math per GPU-hour in {month_of(max(ds.end - 1, ds.start))}\"")
    if end <= ds.start or start >= ds.end:
        raise CannotAnswer(f"I can't answer that: the ledger has no data in {label}.")
    return q, kind, name, start, end, label


def answer(ds, found, text: str, prepared: tuple | None = None, billed=None, statement=None) -> dict:  # noqa: ANN001
    """Parse, resolve and answer a question with the accounting agent's explanation (one table behind each answer:
    the sentence restates its shown figures, never recomputes them).

    ``found`` is the agents' findings, or a callable returning them (run only once the question is understood);
    ``billed`` the statement rows of the period when it is a billed month (:func:`ledger.agents.query.billed_rows`);
    ``statement`` that month's whole statement, which the math question reads
    (:func:`ledger.agents.query.billed_statement`).
    """
    from . import query

    q, kind, name, start, end, label = prepared or prepare(ds, text)
    if callable(found):
        found = found()
    if q.form == "rank":
        return _rank(ds, q, start, end, label, text)
    if q.form == "math":
        return _math(statement, label, text)
    ex = query.scope(ds, found, kind, name, start, end, billed)
    tab = ex["table"]   # the shown figures: an answer never restates a number differently from its table
    who = "the fleet" if kind == "fleet" else f"{kind} {name}"
    util = tab["delivered"] / tab["paid"] if tab["paid"] else 0.0
    if q.form == "how_many":
        v = {"lose": tab["lost"], "waste": tab["lost"], "deliver": tab["delivered"], "pay for": tab["paid"]}[q.verb]
        verb = {"lose": "lost", "waste": "lost", "deliver": "delivered", "pay for": "was paid for"}[q.verb]
        text_out = f"{who} {verb} {v:,.1f} GPU-hours in {label}. " + ex["answer"]
    elif q.form == "why":
        claim = f" (you said {q.claimed:,.0f})" if q.claimed is not None else ""
        text_out = f"{who} lost {tab['lost']:,.1f} GPU-hours in {label}{claim}. " + ex["answer"]
    elif q.form == "slow":
        text_out = (f"{who} delivered {tab['delivered']:,.1f} of the {tab['paid']:,.1f} GPU-hours paid in {label} "
                    f"({util:.0%} of its rated work). " + ex["answer"])
    elif q.form == "util":
        text_out = (f"The utilization of {who} in {label} was {util:.0%}: {tab['delivered']:,.1f} GPU-hours "
                    f"delivered of {tab['paid']:,.1f} paid (delivered = activity x clock against the SKU rating). "
                    + ex["answer"])
    elif q.form == "cost":
        text_out, money = _cost(ds, ex, q, who, label)
        ex = dict(ex, money=money)
    else:
        text_out = ex["answer"]
    return dict(ex, question=text, form=q.form, period_label=label, answer=text_out)


def _money(x: float) -> float:
    """Money rounded once, to the cent, half to even (the receipts' rule: :func:`accounting.cents`)."""
    from .accounting import cents

    return cents(x)


def _cost(ds, ex: dict, q: Question, who: str, label: str) -> tuple[str, dict]:  # noqa: ANN001
    """A cause's line (or a scope's paid hours) priced at the scope's mean rate: one figure, rounded once."""
    from .query import rate_text

    acct = ex["account"]
    rate = acct["cost"]["paid"] / acct["paid"] if acct["paid"] else ds.rate(None, None)
    if q.scope_kind == "fleet" and q.verb in CAUSES:
        cause = CAUSES[q.verb]
        line = next((ln for ln in ex["table"]["lines"] if ln["cause"] == cause), {"gpu_hours": 0.0})
        hours = ex["by_cause"].get(cause, 0.0)
        amount = _money(hours * rate)
        what = cause.replace("_", " ")
        shown_rate = rate_text(amount, line["gpu_hours"], rate)   # the printed figures multiply to the amount
        return (f"{what.capitalize()} cost the fleet {line['gpu_hours']:,.1f} GPU-hours in {label}, "
                f"{amount:,.2f} {ds.currency} at {shown_rate} {ds.currency} per GPU-hour. " + ex["answer"],
                {"cause": cause, "gpu_hours": line["gpu_hours"], "amount": amount, "rate": shown_rate,
                 "currency": ds.currency})
    paid_cost, lost_cost = _money(acct["cost"]["paid"]), _money(acct["cost"]["lost"])
    return (f"{who} cost {paid_cost:,.2f} {ds.currency} for {ex['table']['paid']:,.1f} GPU-hours in {label}, of "
            f"which {lost_cost:,.2f} {ds.currency} paid for work not delivered. " + ex["answer"],
            {"paid": paid_cost, "lost": lost_cost, "currency": ds.currency})


def _rank(ds, q: Question, start: float, end: float, label: str, text: str) -> dict:  # noqa: ANN001
    """The top ten tenants / jobs / nodes / racks by lost (or delivered, or paid) GPU-hours in the period."""
    from .query import ranking

    by = {"jobs": "job", "job": "job", "tenants": "tenant", "tenant": "tenant", "accounts": "tenant",
          "account": "tenant", "nodes": "node", "node": "node", "racks": "rack", "rack": "rack"}[q.verb]
    col = {"lost": "lost", "wasted": "lost", "delivered": "delivered", "used": "delivered", "paid for": "paid"}
    m = re.search(r"(lost|wasted|delivered|used|paid for) the most", text.lower())
    key = col[m.group(1)] if m else "lost"
    rows = ranking(ds, by, key, start, end)
    if not rows:
        raise CannotAnswer(f"I can't answer that: no {by}s held GPUs in {label}.")
    word = {"lost": "lost", "delivered": "delivered", "paid": "paid for"}[key]
    top = "; ".join(f"{r[by]} {r[key]:,.1f}" for r in rows[:3])
    return {"question": text, "form": "rank", "period_label": label, "ranking": rows, "by": by, "key": key,
            "table": {"rows": rows}, "answer": f"The {by}s that {word} the most GPU-hours in {label}: {top}."}


def _math(statement, label: str, text: str) -> dict:  # noqa: ANN001 - a reports.export.Statement or None
    """The tenants ranked by the math their paid GPU-hours did, from the month's statement
    (:func:`ledger.agents.query.math_ranking`): the same figures ``export monthly`` prints for them."""
    from .query import math_ranking

    if statement is None:
        raise CannotAnswer(f"I can't answer that: no receipts were issued for {label}, and the math per GPU-hour "
                           f"is the statement's (run `ipledger issue --month {label}` first).")
    rows = math_ranking(statement.summary.by_tenant)
    ranked = [r for r in rows if r["pflop_hours_per_paid_gpu_hour"] is not None]
    if not ranked:
        return {"question": text, "form": "math", "period_label": label, "ranking": rows, "by": "tenant",
                "table": {"rows": rows}, "answer": f"No receipt issued for {label} measured the effective-compute "
                f"lens (tensor activity and the SKU's rating): the math per GPU-hour is unknown, not zero."}
    top = "; ".join(f"{r['tenant']} {r['pflop_hours_per_paid_gpu_hour']:,.4f}" for r in ranked[:3])
    unmeasured = [r["tenant"] for r in rows if r["pflop_hours_per_paid_gpu_hour"] is None]
    tail = f" Not measured (unknown, not zero): {', '.join(map(str, unmeasured))}." if unmeasured else ""
    return {"question": text, "form": "math", "period_label": label, "ranking": rows, "by": "tenant",
            "table": {"rows": rows},
            "answer": (f"The tenants that got the most math per paid GPU-hour in {label} (achieved PFLOP-hours per "
                       f"paid GPU-hour, from the statement's effective-compute lens): {top}.{tail}")}
