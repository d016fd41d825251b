"""The viewer's HTML, rendered on the server: the run page, the episode list, a group, a session
(conversation and token view) and the message page. Every value from the run is escaped.

Owns markup only; what it shows comes from `tracerl.view.reader` and `tracerl.view.tokens`, and
the charts and live refresh are drawn in the browser by the package's static scripts
(`static/chart.js`, `static/view.js`; no CDN: nothing outside the machine is reachable).
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from tracerl.run.plot import CHARTS
from tracerl.trace.schema import SessionTrace, Turn
from tracerl.view.conversation import Message, request_messages, response_messages
from tracerl.view.reader import EpisodeFilter, SessionSummary
from tracerl.view.tokens import TokenTrajectory


def layout(title: str, body: str, refresh_s: float, notes: Sequence[str] = ()) -> str:
    """A whole page: navigation, the messages `notes` (problems with the run), `body`."""
    note_html = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)} · tracerl view</title>"
        '<link rel=stylesheet href="/static/view.css">'
        '<script src="/static/chart.js" defer></script>'
        '<script src="/static/view.js" defer></script></head>'
        f'<body data-refresh="{refresh_s:g}"><nav><b>tracerl view</b> '
        '<a href="/">run</a> <a href="/episodes">episodes</a></nav>'
        f"<main><h1>{escape(title)}</h1>{note_html}{body}</main></body></html>"
    )


def message_page(title: str, message: str, refresh_s: float) -> str:
    """A page that says only what is wrong (a missing run directory, an unknown session)."""
    return layout(title, f'<p class="note" id="message">{escape(message)}</p>', refresh_s)


def _table(head: Iterable[str], rows: Iterable[Iterable[str]], body_id: str = "") -> str:
    """`rows` are HTML already (escaped cells)."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    tbody_id = f' id="{body_id}"' if body_id else ""
    return f"<table><thead><tr>{th}</tr></thead><tbody{tbody_id}>{tr}</tbody></table>"


def _number(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else "—"
    return "—" if value is None else escape(str(value))


# ---------------------------------------------------------------------------------- run page


def run_page(
    run_name: str, config: dict[str, Any] | None, refresh_s: float, notes: list[str]
) -> str:
    trainer = (config or {}).get("trainer") or {}
    env = ((config or {}).get("env") or {}).get("name")
    facts = ", ".join(
        f"{k} {escape(str(v))}"
        for k, v in (("model", trainer.get("model")), ("algorithm", trainer.get("algorithm")),
                     ("env", env))
        if v
    )  # fmt: skip
    charts = "".join(
        f'<figure class=chart data-chart="{escape(name)}" data-keys="{escape(",".join(keys))}">'
        f"<figcaption>{escape(name.replace('_', ' '))}</figcaption><svg></svg></figure>"
        for name, keys in CHARTS.items()
    )
    body = (
        f"<p>{facts or 'no config.json yet'}</p>"
        "<p id=metrics-status class=muted>loading metrics…</p>"
        f'<section id=charts data-metrics="/api/metrics">{charts}</section>'
    )
    return layout(f"run {run_name}", body, refresh_s, notes)


# ------------------------------------------------------------------------------ episode list

FILTER_FIELDS = (
    ("step", "step"),
    ("version", "weight version"),
    ("env", "env"),
    ("kind", "kind"),
    ("group", "group"),
    ("reward_min", "reward ≥"),
    ("reward_max", "reward ≤"),
)


def _filter_form(wanted: EpisodeFilter, choices: dict[str, list[Any]]) -> str:
    inputs = []
    for name, label in FILTER_FIELDS:
        value = getattr(wanted, name)
        shown = "" if value is None else escape(str(value))
        listed = choices.get(name)
        list_attr = f' list="{name}-choices"' if listed else ""
        inputs.append(
            f'<label>{escape(label)} <input name={name} value="{shown}" size=6{list_attr}></label>'
        )
        if listed:
            options = "".join(f'<option value="{escape(str(c))}">' for c in listed)
            inputs.append(f'<datalist id="{name}-choices">{options}</datalist>')
    selected = {None: "", True: "yes", False: "no"}[wanted.failed]
    options = "".join(
        f'<option value="{v}"{" selected" if v == selected else ""}>{label}</option>'
        for v, label in (("", "any"), ("yes", "failed"), ("no", "succeeded"))
    )
    inputs.append(f"<label>outcome <select name=failed>{options}</select></label>")
    return f"<form id=filters method=get>{''.join(inputs)} <button>filter</button></form>"


def episode_rows(
    rows: list[dict[str, Any]],
    summaries: dict[str, SessionSummary],
    reasons: dict[str, str | None],
) -> list[list[str]]:
    out = []
    for row in rows:
        sid = str(row["session_id"])
        summary = summaries.get(sid)
        failed = bool(row.get("failed"))
        outcome = (
            f"<span class=bad>failed</span> {escape(reasons.get(sid) or '')}" if failed else "ok"
        )
        group = row.get("group")
        out.append(
            [
                f'<a href="/sessions/{_q(sid)}">{escape(sid[:12])}</a>',
                _number(row.get("step")),
                _number(row.get("version")),
                escape(str(row.get("env", ""))),
                escape(str(row.get("kind", ""))),
                f'<a href="/groups/{_q(str(group))}">{_number(group)}</a>',
                _number(row.get("reward")),
                outcome,
                _number(row.get("tokens")),
                str(summary.turns) if summary else "—",
                escape(summary.status) if summary else "not in store",
            ]
        )
    return out


EPISODE_HEAD = ("session", "step", "version", "env", "kind", "group", "reward", "outcome",
                "sampled tokens", "turns", "status")  # fmt: skip


def pager(total: int, page: int, size: int, query: dict[str, str]) -> str:
    pages = max(1, math.ceil(total / size))
    links = []
    for label, target in (("« first", 0), ("‹ newer", page - 1), ("older ›", page + 1),
                          ("last »", pages - 1)):  # fmt: skip
        if 0 <= target < pages and target != page:
            href = "?" + urllib.parse.urlencode({**query, "page": str(target)})
            links.append(f'<a href="{escape(href)}">{label}</a>')
    return (
        f"<p class=pager><span id=episode-count>{total}</span> episodes · page {page + 1} of "
        f"{pages} {' '.join(links)}</p>"
    )


def episodes_page(
    wanted: EpisodeFilter,
    choices: dict[str, list[Any]],
    table_html: str,
    query: dict[str, str],
    refresh_s: float,
    notes: list[str],
) -> str:
    live = "/episodes/rows?" + urllib.parse.urlencode(query)
    body = (
        _filter_form(wanted, choices)
        + f'<div id=episode-table data-live="{escape(live)}">{table_html}</div>'
    )
    return layout("episodes", body, refresh_s, notes)


def episode_table(
    total: int, page: int, size: int, query: dict[str, str], rows: list[list[str]]
) -> str:
    """The live part of the episode list: counts, pager and the page's rows."""
    return pager(total, page, size, query) + _table(EPISODE_HEAD, rows, "episode-rows")


# ------------------------------------------------------------------------------------- group


def group_page(
    group: int,
    members: list[dict[str, Any]],
    advantages: dict[str, float | None],
    advantage_note: str,
    traces: dict[str, SessionTrace | None],
    ended: dict[str, Any] | None,
    refresh_s: float,
) -> str:
    if not members:
        return message_page(f"group {group}", f"no episode of group {group} is listed", refresh_s)
    first = next((t for t in traces.values() if t is not None and t.turns), None)
    prompt = _messages_html(request_messages(first.turns[0].request)) if first else ""
    cards = []
    for row in members:
        sid = str(row["session_id"])
        trace = traces.get(sid)
        reply = (
            _messages_html(response_messages(trace.turns[-1].response))
            if trace is not None and trace.turns
            else "<p class=note>this session has no turns</p>"
        )
        outcome = "failed: " + escape(str(row.get("reason") or "")) if row.get("failed") else ""
        cards.append(
            f'<div class=sample><h3><a href="/sessions/{_q(sid)}">{escape(sid[:12])}</a></h3>'
            f"<p>reward <b>{_number(row.get('reward'))}</b> · advantage "
            f"<b>{_number(advantages.get(sid))}</b> · step {_number(row.get('step'))} · "
            f"version {_number(row.get('version'))} {outcome}</p>{reply}</div>"
        )
    body = (
        f"<p class=group-outcome>{escape(_group_outcome(ended, members))}</p>"
        f"<p class=muted>{escape(advantage_note)}</p><h2>prompt</h2>{prompt}"
        f"<h2>{len(members)} samples</h2><div class=samples>{''.join(cards)}</div>"
    )
    return layout(f"group {group}", body, refresh_s)


def _group_outcome(ended: dict[str, Any] | None, members: list[dict[str, Any]]) -> str:
    """What became of a group, from its `groups.jsonl` line (`ended`)."""
    if all(row.get("kind") == "eval" for row in members):
        return "an eval group: measured, never trained"
    if ended is None:
        return "not ended: its episodes are still playing, or the run stopped before they all did"
    if ended.get("outcome") == "trained":
        return f"trained at step {_number(ended.get('step'))}"
    return f"never trained: {ended.get('outcome')}"


# ----------------------------------------------------------------------------------- session


def _messages_html(messages: list[Message]) -> str:
    out = []
    for m in messages:
        parts = []
        for p in m.parts:
            label = f"<span class=label>{escape(p.label)}</span>" if p.label else ""
            parts.append(f'<div class="part {p.kind}">{label}<pre>{escape(p.text)}</pre></div>')
        out.append(
            f'<div class="msg role-{escape(m.role)}"><span class=role>{escape(m.role)}</span>'
            f"{''.join(parts)}</div>"
        )
    return "".join(out)


def _turn_html(turn: Turn) -> str:
    facts = (
        f"{turn.endpoint} · "
        + (f"adapter {escape(turn.adapter)} " if turn.adapter is not None else "")
        + f"weight version {turn.weight_version} · finish {turn.finish_reason}"
        f" · {len(turn.prompt_ids)} prompt + {len(turn.completion_ids)} completion tokens"
        + (f" · extends turn {turn.parent}" if turn.parent is not None else "")
        + (" (bridged: the template re-renders that reply)" if turn.bridged else "")
        + (f" · new trajectory: {turn.fork_reason}" if turn.fork_reason else "")
        + (" · client disconnected" if turn.client_disconnected else "")
    )
    return (
        f"<details class=turn open><summary>turn {turn.index} <span class=muted>"
        f"{escape(facts)}</span></summary><div class=exchange><div><h4>request</h4>"
        f"{_messages_html(request_messages(turn.request))}</div><div><h4>response</h4>"
        f"{_messages_html(response_messages(turn.response))}</div></div></details>"
    )


def heat(logprob: float) -> str:
    """A sampled token's background: red where the model gave it little probability, through
    yellow, to green where it was near certain (hue = 120 · p)."""
    p = math.exp(max(logprob, -50.0))
    return f"hsl({120 * p:.0f},75%,80%)"


def _trajectory_html(t: TokenTrajectory) -> str:
    starts = {s.start: s for s in t.spans}
    tokens = []
    for i, (token_id, text) in enumerate(zip(t.token_ids, t.texts, strict=True)):
        span = starts.get(i)
        if span is not None:
            tokens.append(
                f'<span class=turn-mark data-turn="{span.turn}">turn {span.turn} · '
                f"v{span.weight_version}</span>"
            )
        if t.loss_mask[i]:
            lp = t.logprobs[i]
            tokens.append(
                f'<span class="tok s" data-id="{token_id}" data-lp="{lp:.4f}" '
                f'style="background:{heat(lp)}" title="id {token_id} · sampled · logprob '
                f'{lp:.3f}">{escape(text)}</span>'
            )
        else:
            tokens.append(
                f'<span class="tok c" data-id="{token_id}" title="id {token_id} · context">'
                f"{escape(text)}</span>"
            )
    fork = (
        f" · <b class=fork>fork of turn {t.fork_of}</b> (its shared prefix is context here)"
        if t.fork_of is not None
        else ""
    )
    return (
        f'<section class=trajectory data-trajectory="{t.index}"><h3>trajectory {t.index}</h3>'
        f"<p class=muted>{len(t.token_ids)} tokens, {t.sampled} sampled · turns "
        f"{', '.join(str(s.turn) for s in t.spans)}{fork}</p>"
        f"<div class=tokens>{''.join(tokens)}</div></section>"
    )


def session_body(trace: SessionTrace, view: list[TokenTrajectory], token_note: str | None) -> str:
    """The part of a session page that changes while the session is open."""
    if not trace.turns:
        return "<p class=note id=no-turns>this session has no turns (nothing was recorded)</p>"
    legend = (
        '<p class=legend><span class="tok s" style="background:hsl(120,75%,80%)">sampled, p≈1'
        '</span> <span class="tok s" style="background:hsl(0,75%,80%)">sampled, p≈0</span> '
        '<span class="tok c">context</span> (hover a token for its id and log-prob)</p>'
    )
    note = f"<p class=note>{escape(token_note)}</p>" if token_note else ""
    return (
        f"<h2>turns ({len(trace.turns)})</h2>{''.join(_turn_html(t) for t in trace.turns)}"
        f"<h2>tokens</h2>{note}{legend}{''.join(_trajectory_html(t) for t in view)}"
    )


def session_page(
    trace: SessionTrace,
    episode: dict[str, Any] | None,
    reason: str | None,
    body_html: str,
    curl: str,
    refresh_s: float,
) -> str:
    sid = trace.session_id
    facts = [f"status {escape(trace.status)}"]
    if episode:
        for key in ("step", "version", "env", "kind", "reward"):
            facts.append(f"{key} {_number(episode.get(key))}")
        group = episode.get("group")
        facts.append(f'<a href="/groups/{_q(str(group))}">group {_number(group)}</a>')
    if reason:
        facts.append(f"<span class=bad>failed: {escape(reason)}</span>")
    live = f' data-live="/sessions/{_q(sid)}/live"' if trace.status == "open" else ""
    body = (
        f"<p>{' · '.join(facts)}</p>"
        f'<p><a id=export href="/api/sessions/{_q(sid)}?download=1">export JSON</a> '
        "(the trace schema) · admin endpoint: <code id=curl>"
        f"{escape(curl)}</code> <button data-copy=curl>copy</button></p>"
        f"<div id=session-body{live}>{body_html}</div>"
    )
    return layout(f"session {sid}", body, refresh_s)


def _q(text: str) -> str:
    return escape(urllib.parse.quote(text, safe=""))
