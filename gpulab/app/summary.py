"""The summary of a course run, built only from result JSON files: tables, a figure, the README's section.

A headline gain (`headline_gains`) never comes from a smoke or CPU run, nor from an implausible ratio (a scaling
efficiency over 100%, CPU processes standing in for GPUs), which is flagged instead; a demonstration's contrast
(tiny kernels vs one big matmul) is not a gain to adopt. Files written before a field existed still summarise:
a missing kind is an optimisation, a missing side or evidence counts as measured, a missing origin comes from
the source, a claim without a key matches on its text.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from ..verdicts.claims import VERDICTS, Claim
from ..measuring.estimates import Estimate
from ..verdicts.tally import agreement, claim_origin, count_verdicts, fold_claims, match_claims
from ..measuring.host import recorded_host, speed_difference
from ..verdicts.results import ResultError, load_result, named

COUNTS_NOTE = ("Verdicts are counted per claim: claims that share one measurement each count with their own "
               "verdict; \"settled without measuring\" holds claims confirmed or refuted by arithmetic, a datasheet "
               "or a definition. The verdict columns count the guide's claims; the course's own targets (floors and "
               "checks the course sets itself) are counted apart. The wall (s) is the lesson's own time, from the "
               "lesson's first cell to its save (the runner's seconds add the kernel's start and papermill's "
               "writing). The headline gain is the optimisation each lesson teaches, on equal work, with its 95% "
               "interval.")
NOT_SPEED = "smoke run: not a speed measurement"

RESULT_GLOB = "[0-9][0-9]_*.json"


def collect(folder: Path | str, expected: Sequence[str] = (),
            exclude: Sequence[str] = ()) -> tuple[dict[str, dict], list[str]]:
    """Load every result JSON in `folder`; return (results by notebook, problems), naming each bad file.

    A result is its file's: a file whose `notebook` field disagrees with its name (a backup `01_measuring_old.json`)
    is skipped with a problem, so it can never stand in for another notebook's row. `exclude` names notebooks whose
    results must not be shown (one that failed in this run)."""
    folder = Path(folder)
    found: dict[str, dict] = {}
    problems: list[str] = []
    if not folder.is_dir():
        return found, [f"no results folder {folder}"]
    misnamed: list[tuple[Path, str]] = []
    for path in sorted(folder.glob(RESULT_GLOB)):
        if not path.is_file():  # a named pipe or a device would hang the read
            problems.append(f"skipped {path.name}: not a regular file")
            continue
        try:
            data = load_result(path)
        except ResultError as e:
            problems.append(f"skipped {path.name}: {str(e).removeprefix(str(path) + ': ')}")
            continue
        problems += unknown_verdicts(data, path.name)
        if data["notebook"] != path.stem:
            misnamed.append((path, data["notebook"]))
        elif path.stem not in exclude:
            found[path.stem] = data
    for path, claimed in misnamed:
        if (folder / f"{claimed}.json").is_file():
            problems.append(f"skipped {path.name}: it claims to be {claimed}, whose result is {claimed}.json "
                            "(a copy or a backup? results are read by file name)")
        else:
            problems.append(f"skipped {path.name}: its notebook field says {claimed!r}, not {path.stem!r} "
                            "(results are read by file name: <notebook>.json)")
    for name in expected:
        if name not in found and name not in exclude:
            problems.append(f"missing: no result for {name} in {folder}")
    return found, problems


def _fmt(x: float | None, fmt: str) -> str:
    return "—" if x is None else fmt.format(x)


def _date(data: dict) -> str:
    created = data.get("created")
    return created[:16].replace("T", " ") if isinstance(created, str) and created else "—"


def _verdict(c: dict) -> str:
    v = c.get("verdict", "—")
    return f"refuted: {c['side']} than claimed" if v == "refuted" and c.get("side") else v


def _verdict_and_value(c: dict) -> str:
    """The verdict with the measurement it stands on: 'inconclusive: 0.718% [0.255, 1.08]'."""
    if c.get("measured") is None:
        return _verdict(c)
    try:
        return f"{_verdict(c)}: {Claim.from_dict(c)._measured_str()}"
    except (TypeError, ValueError, KeyError):  # an older file's claim: its verdict alone
        return _verdict(c)


def _kind(e: dict) -> str:
    return e.get("kind") or "optimisation"


def not_a_speed_run(data: dict) -> str | None:
    """Why a result's timings are no speed measurement (a smoke run, or no CUDA GPU), or None for a full-size
    GPU run."""
    if data.get("smoke"):
        return NOT_SPEED
    if (data.get("device") or {}).get("kind") != "cuda":
        return "CPU run: not a GPU speed measurement"
    return None


def gain(e: dict) -> Estimate:
    """An experiment's work-normalised ratio with its interval: items/s after over before whenever the items per
    call differ (FLOP/s where no items are counted and the FLOPs differ), else the time ratio (before time / after
    time). Older files: recomputed from both sides."""
    if e.get("ratio") is not None and e.get("ratio_interval"):
        lo, hi = e["ratio_interval"]
        return Estimate(e["ratio"], min(lo, e["ratio"]), max(hi, e["ratio"]))
    v = e["speedup"]
    lo, hi = e.get("speedup_interval") or (v, v)
    ib, ia = (e.get("before") or {}).get("items"), (e.get("after") or {}).get("items")
    if not (ib and ia):  # no items on a side: FLOPs per call say whether the work differs
        ib, ia = (((e.get(side) or {}).get("summary") or {}).get("flops") for side in ("before", "after"))
    k = ia / ib if ib and ia and abs(ia - ib) > 1e-9 * max(ia, ib) else 1.0  # unequal work: items/s or FLOP/s
    return Estimate(v * k, min(lo, v) * k, max(hi, v) * k)


_SCALING = re.compile(r"(\d+)\s*(?:->|→|to|vs)\s*(\d+)\s*(GPUs?|processes|ranks|workers? processes)", re.I)


def implausible(e: dict, data: dict) -> str | None:
    """Why an experiment's ratio cannot be a gain (None when it can): CPU processes standing in for GPUs, or
    N -> M GPUs scaling faster than M/N (a scaling efficiency over 100%)."""
    name = e.get("name", "")
    m = _SCALING.search(name)
    many = m is not None or re.search(r"\b(DDP|FSDP\d?|GPUs|ranks)\b", name) is not None
    if many and (data.get("device") or {}).get("kind") != "cuda":
        return "CPU processes stand in for GPUs: not a multi-GPU measurement"
    if m and int(m.group(1)) > 0 and int(m.group(2)) > int(m.group(1)):
        eff = gain(e).value / (int(m.group(2)) / int(m.group(1)))
        if eff > 1.0:
            return f"scaling efficiency {100 * eff:.0f}% is over 100%"
    return None


def flagged(results: dict[str, dict]) -> list[str]:
    """Every implausible ratio in `results`: experiments (`implausible`) and efficiency claims over 100%."""
    out = []
    for nb, data in sorted(results.items()):
        for e in data.get("experiments", []):
            why = implausible(e, data)
            if why:
                out.append(f"{nb} '{e['name']}' ({gain(e).value:.2f}x): {why}; kept out of the gains")
        for c in data.get("claims", []):
            v = c.get("measured")
            if "efficiency" in c.get("text", "").lower() and c.get("unit") == "%" and v is not None and v > 100:
                out.append(f"{nb} claim {c.get('key') or c.get('text')!r}: efficiency {v:.0f}% is over 100%")
    return out


def gains(data: dict) -> list[tuple[dict, Estimate]]:
    """The gains one result shows, with their work-normalised ratios, largest first: the experiments its lesson
    marks as the headline, or where none is marked (older results) every optimisation; none from a smoke or CPU
    run, and none that is implausible."""
    if not_a_speed_run(data):
        return []
    exps = data.get("experiments", [])
    marked = [e for e in exps if e.get("headline")]
    pool = marked or [e for e in exps if _kind(e) == "optimisation"]
    out = [(e, gain(e)) for e in pool if not implausible(e, data)]
    return sorted(out, key=lambda p: -p[1].value)


def headline_gains(data: dict) -> list[tuple[dict, Estimate]]:
    """The notebook's headline gain(s): every experiment its lesson marks as the headline, else (a result that
    marks none) its largest optimisation; empty for a smoke or CPU run."""
    g = gains(data)
    return g if any(e.get("headline") for e, _ in g) else g[:1]


def _claim_cells(c: dict) -> tuple[str, str]:
    """(measured [interval], verdict) of a result JSON claim as the tables show them."""
    try:
        measured = Claim.from_dict(c)._measured_str()
    except (TypeError, ValueError, KeyError):  # an older file's claim: its value alone
        measured = _fmt(c.get("measured"), "{:.3g}")
    return measured, _verdict(c)


def summary_tables(results: dict[str, dict], reference: dict[str, dict] | None = None) -> str:
    """Markdown tables of every before/after and every claim, with intervals, and the reference beside when given.
    A smoke or CPU run's experiments show no speed verdict."""
    reference = reference or {}
    ref_col = " | reference ratio" if reference else ""
    lines = ["| notebook | experiment | kind | ratio [95% interval] (items/s or FLOP/s where the work differs) "
             "| verdict | MFU before | MFU after | GPU busy before | GPU busy after" + ref_col + " |",
             "|" + " --- |" * (9 + bool(reference))]
    for nb, data in sorted(results.items()):
        refs = {e["name"]: e for e in reference.get(nb, {}).get("experiments", [])}
        not_speed = not_a_speed_run(data)
        for e in data["experiments"]:
            b, a = e["before"]["summary"], e["after"]["summary"]
            mfu = [_fmt(None if s.get("mfu") is None else s["mfu"] * 100, "{:.1f}%") for s in (b, a)]
            util = [_fmt(s.get("nvml_util"), "{:.0f}%") for s in (b, a)]
            flag = implausible(e, data)
            name = f"**{e['name']}** (headline)" if e.get("headline") else e["name"]
            verdict = not_speed or e.get("verdict", "—")
            ratio = "—" if not_speed else _ratio_str(gain(e))
            row = (f"| {nb} | {name}{' (flagged: ' + flag + ')' if flag else ''} | {_kind(e)} | "
                   f"{ratio} | {verdict} | {mfu[0]} | {mfu[1]} | {util[0]} | {util[1]}")
            if reference:
                r = named(refs, e["name"])  # by its older name too
                row += f" | {_ratio_str(gain(r)) if r else '—'}"
            lines.append(row + " |")
    ref_c = " | reference measured | reference verdict" if reference else ""
    lines += ["", "| notebook | claim | origin | expected | measured [interval] | verdict" + ref_c + " |",
              "|" + " --- |" * (6 + 2 * bool(reference))]
    for nb, data in sorted(results.items()):
        refs = {id(mine): theirs for _, theirs, mine in match_claims(reference.get(nb, {}).get("claims", []),
                                                                      data["claims"])}
        for head, group in fold_claims(data["claims"]):
            c = head if head is not None else group[0]
            keys = [x.get("key") or x.get("text", "") for x in group]
            if head is None:  # not-comparable claims beside one measurement: one row
                label = f"{len(group)} claims of other systems beside one measurement: " + ", ".join(
                    f"`{k}`" for k in keys)
                expected = ", ".join(x.get("expected", "") for x in group)
            else:
                label = c["text"] + (f" (`{c['key']}`)" if c.get("key") else "")
                if group:
                    label += "; the same measurement beside " + ", ".join(f"`{k}`" for k in keys) + \
                             " (not comparable)"
                expected = c.get("expected", "")
            measured, verdict = _claim_cells(c)
            row = f"| {nb} | {label} | {claim_origin(c)} | {expected} | {measured} | {verdict}"
            if reference:
                r = refs.get(id(c), {})
                row += f" | {_claim_cells(r)[0] if r else '—'} | {_verdict(r) if r else '—'}"
            lines.append(row + " |")
    return "\n".join(lines)


def agreement_section(results: dict[str, dict], reference: dict[str, dict]) -> str:
    """Markdown: how this run's verdicts agree with the reference's, claim by claim (matched by notebook and
    claim key; by text only for older files without keys); the claims whose verdict differs, and first those
    confirmed in one run and refuted in the other."""
    r = agreement({nb: d.get("claims", []) for nb, d in results.items()},
                  {nb: d.get("claims", []) for nb, d in reference.items()})
    if not r["claims"]:
        return "No claim is in both this run and the reference."
    lines = [f"{r['same']} of {r['claims']} claims in both runs have the same verdict ({100 * r['share_same']:.1f}%); "
             f"{len(r['confirmed_vs_refuted'])} confirmed in one and refuted in the other."]
    if r["changed"]:
        lines += ["", "| notebook | claim | this run | reference |", "| --- | --- | --- | --- |"]
        flips = {(nb, t) for nb, t, _, _ in r["confirmed_vs_refuted"]}
        for nb, ident, va, vb in sorted(r["changed"], key=lambda x: ((x[0], x[1]) not in flips, x[0])):
            mine, theirs = next((m, t) for i, m, t in match_claims(results[nb].get("claims", []),
                                                                   reference[nb].get("claims", [])) if i == ident)
            mark = "**" if (nb, ident) in flips else ""
            label = mine.get("text", ident) + (f" (`{mine['key']}`)" if mine.get("key") else "")
            lines.append(f"| {nb} | {mark}{label}{mark} | {_verdict_and_value(mine)} | {_verdict_and_value(theirs)} |")
        hosts = [f"- {nb}: {line}" for nb in sorted({c[0] for c in r["changed"]})
                 if (line := speed_difference(recorded_host(results[nb]), recorded_host(reference[nb])))]
        if hosts:  # launch-bound verdicts follow the host's speed: say how fast each run's host was
            lines += ["", "The host's speed during the notebooks whose verdicts differ (timed at each one's start "
                      "and end):", ""] + hosts
    return "\n".join(lines)


def _course_counts(claims: list[dict]) -> str:
    """The course's own targets' verdicts in a few words ("2 confirmed, 1 refuted"), or "—"."""
    n = count_verdicts(claims, origin="course")
    parts = [(n["confirmed"] + n["not_measured"], "confirmed or settled"),
             (n["refuted_higher"] + n["refuted_lower"], "refuted"), (n["inconclusive"], "inconclusive"),
             (n["not comparable"], "not comparable"), (n["not tested"], "not tested")]
    return ", ".join(f"{k} {w}" for k, w in parts if k) or "—"


def notebook_table(results: dict[str, dict], *, dates: bool = True) -> str:
    """Markdown: one row per notebook, with its date, its wall time, its headline gain and its claims' verdicts.

    The headline gain (`headline_gains`) is on equal work, with its 95% interval. The verdict columns count the
    guide's claims, settled by arithmetic, a datasheet or a definition apart from measured ones; the course's own
    targets have their own column."""
    head = ["notebook"] + (["date (UTC)"] if dates else []) + [
        "wall (s)", "experiments", "headline gain [95% interval]", "confirmed", "refuted: higher than claimed",
        "refuted: lower than claimed", "inconclusive", "not comparable", "not tested", "settled without measuring",
        "course's own targets"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for nb, data in sorted(results.items()):
        g = [] if nb.startswith("00_") else headline_gains(data)  # the self-check is a control, not a change
        best = "; ".join(f"{_ratio_str(est)}: {e['name']}" for e, est in g) if g else (
            not_a_speed_run(data) or "—")
        n = count_verdicts(data["claims"], origin="guide")
        wall = data.get("wall_s")
        cells = [nb] + ([_date(data)] if dates else []) + [
            _fmt(wall if isinstance(wall, (int, float)) else None, "{:.0f}"), str(len(data["experiments"])), best,
            n["confirmed"], n["refuted_higher"], n["refuted_lower"], n["inconclusive"], n["not comparable"],
            n["not tested"], n["not_measured"], _course_counts(data["claims"])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def _ratio_str(est: Estimate) -> str:
    return f"{est.value:.2f}x" + (f" [{est.lo:.2f}, {est.hi:.2f}]" if est.lo != est.hi else "")


def unknown_verdicts(data: dict, name: str) -> list[str]:
    """A problem line for each claim whose verdict gpulab does not know (it is left out of every count)."""
    return [f"{name}: claim {c.get('key') or c.get('text')!r} has the verdict {c.get('verdict')!r}, which gpulab does "
            f"not know ({', '.join(VERDICTS)}); it is left out of every count"
            for c in data.get("claims", []) if c.get("verdict") not in VERDICTS]
