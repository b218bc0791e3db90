"""Claims in tables: one row per claim (repeats of one measurement folded), verdict tallies by origin, and the
agreement between two runs' verdicts."""
from __future__ import annotations

import html
from typing import Any

from .claims import _COLORS, ORIGINS, Claim, origin_of


def _claim_row(c: Claim) -> str:
    e = html.escape
    key = f"<br><small><code>{e(c.key)}</code></small>" if c.key else ""
    return (f"<tr><td style='text-align:left'>{e(c.source)}</td><td style='text-align:left'>{e(c.text)}{key}</td>"
            f"<td>{e(c.expected)}</td><td>{e(c._measured_str())}</td>"
            f"<td style='color:{_COLORS.get(c.verdict, '#666')}'><b>{e(c.label)}</b></td>"
            f"<td>{e(c.evidence)}</td><td style='text-align:left'><small>{e(c.note)}</small></td></tr>")


def _folded_row(head: Claim | None, group: list[Claim]) -> str:
    """One row for claims that repeat one measurement: a judged claim's row with the not-comparable claims beside
    it listed under it, or one folded row of not-comparable claims (each with its key, band and our value; the
    reason once when they share it)."""
    e = html.escape
    notes = {c.note for c in group}
    common = notes.pop() if len(notes) == 1 else None
    items = "".join(f"<li>{f'<code>{e(c.key)}</code> ' if c.key else ''}{e(c.text)}: claimed {e(c.expected)}, "
                    f"ours {e(c._measured_str())}{'' if common is not None else f' ({e(c.note)})'}</li>"
                    for c in group)
    why = f": {e(common)}" if common else ""
    if head is not None:
        extra = (f"<tr><td></td><td colspan='6' style='text-align:left'><details><summary><small>the same "
                 f"measurement beside {len(group)} claim{'s' if len(group) > 1 else ''} of other systems, not "
                 f"comparable{why}</small></summary><ul>{items}</ul></details></td></tr>")
        return _claim_row(head) + extra
    values = sorted({c._measured_str() for c in group})
    ours = values[0] if len(values) == 1 else ", ".join(values)
    return (f"<tr><td colspan='7' style='text-align:left'><details><summary>"
            f"<b style='color:{_COLORS['not comparable']}'>{len(group)} claims not comparable</b> beside one measured "
            f"quantity (ours: {e(ours)}){why}</summary><ul>{items}</ul></details></td></tr>")


def measurement_family(c: Claim | dict[str, Any]) -> tuple:
    """What a not-comparable row stands on, for folding rows that repeat one measurement: the source measurement
    (its id up to a ':', so "util:first" and "util:last" of one waterfall are one family) and the unit; claims
    without an id, by their value (3 significant figures) and unit."""
    d = c.to_dict() if isinstance(c, Claim) else c
    mid, unit, v = d.get("measurement"), d.get("unit", ""), d.get("measured")
    if mid:
        return ("id", str(mid).split(":", 1)[0], unit)
    return ("value", None if v is None else float(f"{v:.3g}"), unit)


def fold_claims(claims: list[Claim] | list[dict[str, Any]]) -> list[tuple[Any, list[Any]]]:
    """The rows of a claims table: (claim, []) for a claim shown alone, (judged claim, [not-comparable claims that
    repeat its measurement]) or (None, [not-comparable claims of one measurement family]), in first-seen order.

    A not-comparable claim whose measurement id, unit and value are a judged claim's folds under that claim; the
    others fold by `measurement_family`. Rows that repeat one measurement become one row."""
    def d(c):
        return c.to_dict() if isinstance(c, Claim) else c

    def exact(c):
        x = d(c)
        v = x.get("measured")
        return (x.get("measurement"), x.get("unit"), None if v is None else float(f"{v:.4g}"))

    judged = {}
    for c in claims:
        x = d(c)
        if x.get("verdict") != "not comparable" and x.get("measurement") and x.get("measured") is not None:
            judged.setdefault(exact(c), c)
    under: dict[int, list] = {}
    families: dict[tuple, list] = {}
    for c in claims:
        x = d(c)
        if x.get("verdict") != "not comparable":
            continue
        head = judged.get(exact(c)) if x.get("measurement") else None
        if head is not None:
            under.setdefault(id(head), []).append(c)
        else:
            families.setdefault(measurement_family(c), []).append(c)
    rows, done = [], set()
    for c in claims:
        x = d(c)
        if x.get("verdict") != "not comparable":
            rows.append((c, under.get(id(c), [])))
            continue
        if any(c is m for ms in under.values() for m in ms):
            continue
        fam = measurement_family(c)
        group = families[fam]
        if len(group) == 1:
            rows.append((c, []))
        elif fam not in done:
            done.add(fam)
            rows.append((None, group))
    return rows


def claims_table_html(claims: list[Claim] | list[dict[str, Any]], title: str = "") -> str:
    """Every claim of a lesson in one table: the claim (with its key), its band, what we measured and the verdict.

    Rows that repeat one measurement fold into one (`fold_claims`)."""
    e = html.escape
    cs = [c if isinstance(c, Claim) else Claim.from_dict(c) for c in claims]
    rows = []
    for head, group in fold_claims(cs):
        if head is not None and not group:
            rows.append(_claim_row(head))
        else:
            rows.append(_folded_row(head, group))
    head = ("<tr><th>source</th><th>claim (key)</th><th>claimed</th><th>measured [interval]</th><th>verdict</th>"
            "<th>evidence</th><th>why / how</th></tr>")
    # Folded: the verdict lines above each experiment tell the story; the table is the record, at the page's end.
    return (f"<details class='gpulab-claims'><summary>{f'<b>{e(title)}</b>: ' if title else ''}"
            f"{e(verdict_tally([c.to_dict() for c in cs]))} (the full table: click)</summary>"
            f"<table>{head}{''.join(rows)}</table></details>")


VERDICT_NAMES = {"confirmed": "confirmed", "refuted_higher": "refuted (higher than claimed)",
                 "refuted_lower": "refuted (lower than claimed)", "inconclusive": "inconclusive",
                 "not comparable": "not comparable", "not tested": "not tested",
                 "not_measured": "settled without measuring"}


def verdict_tally(claims: list[dict[str, Any]]) -> str:
    """The claims' verdicts in one line: "20 claims: 6 confirmed, 2 refuted (higher than claimed), ..."."""
    n = count_verdicts(claims)
    parts = ", ".join(f"{v} {VERDICT_NAMES[k]}" for k, v in n.items() if v)
    return f"{len(claims)} claim{'s' if len(claims) != 1 else ''}: {parts}" if claims else "no claims"


def claim_origin(c: dict[str, Any]) -> str:
    """A result JSON claim's origin: its "origin" field, else from its source (older files)."""
    o = c.get("origin")
    return o if o in ORIGINS else origin_of(c.get("source", ""))


def count_verdicts(claims: list[dict[str, Any]], origin: str | None = None) -> dict[str, int]:
    """Verdicts by kind, one count per claim (claims sharing a measurement each count with their own verdict);
    `origin` ("guide" or "course") counts only those claims, None all. Keys: confirmed, refuted_higher,
    refuted_lower, inconclusive, not comparable, not tested, and not_measured (settled by arithmetic, datasheet or
    definition, counted apart)."""
    out = {k: 0 for k in ("confirmed", "refuted_higher", "refuted_lower", "inconclusive", "not comparable",
                          "not tested", "not_measured")}
    for c in claims:
        if origin is not None and claim_origin(c) != origin:
            continue
        v = c.get("verdict", "not tested")
        if v in ("confirmed", "refuted") and c.get("evidence", "measured") != "measured":
            out["not_measured"] += 1
        elif v == "refuted":
            out["refuted_higher" if c.get("side") == "higher" else "refuted_lower"] += 1
        elif v in out:
            out[v] += 1
    return out


def match_claims(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[tuple[str, dict, dict]]:
    """Pairs (id, claim in a, claim in b) of the claims two runs of one notebook share, matched on their `key`
    ("07.bf16_speed"), never on wording; only an older file without keys falls back to the text."""
    keyed = {c["key"]: c for c in a if c.get("key")}
    by_text = {c.get("text"): c for c in a}
    pairs = []
    for c in b:
        key = c.get("key")
        if key and keyed:
            other = keyed.get(key)
        else:  # an older file on one side: its claims have no key
            other = by_text.get(c.get("text"))
            if other is not None and key and other.get("key") and other.get("key") != key:
                other = None
        if other is not None:
            pairs.append((key or other.get("key") or c.get("text", ""), other, c))
    return pairs


def agreement(a: dict[str, list[dict[str, Any]]], b: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """How two runs' verdicts agree, claim by claim (`match_claims`); `a` and `b` map a notebook to its claims.

    Returns the number of claims in both, the share with the same verdict, the claims whose verdict changed and
    those confirmed in one run and refuted in the other, each as (notebook, key or text, verdict in a, in b)."""
    same, both, flips, changed = 0, 0, [], []
    for nb in sorted(set(a) & set(b)):
        for ident, other, c in match_claims(a[nb], b[nb]):
            both += 1
            va, vb = other.get("verdict"), c.get("verdict")
            if va == vb and (va != "refuted" or other.get("side") == c.get("side")):
                same += 1
                continue
            changed.append((nb, ident, va, vb))
            if {va, vb} == {"confirmed", "refuted"}:
                flips.append((nb, ident, va, vb))
    return {"claims": both, "same": same, "share_same": same / both if both else None,
            "confirmed_vs_refuted": flips, "changed": changed}
