"""A summary never mixes runs: results of several devices, or a smoke run beside a full-size one, each get a
section of their own, said plainly in the title; each said plainly in the title."""
from __future__ import annotations

from .summary import COUNTS_NOTE, not_a_speed_run, notebook_table, summary_tables


def device_groups(results: dict[str, dict]) -> list[tuple[str, dict[str, dict]]]:
    """(label, results) per device and size (smoke or full), in first-seen order; one plain label when alone."""
    groups: dict[tuple[str, bool], dict[str, dict]] = {}
    for nb, data in sorted(results.items()):
        name = (data.get("device") or {}).get("name") or "unknown device"
        groups.setdefault((name, bool(data.get("smoke"))), {})[nb] = data
    names = [name for name, _ in groups]
    out = []
    for (name, smoke), found in groups.items():
        size = " (smoke run)" if smoke else " (full size)" if names.count(name) > 1 else ""
        out.append((name + size, found))
    return out


def summary_title(results: dict[str, dict], groups: list[tuple[str, dict[str, dict]]]) -> str:
    """The summary's first line: its device, or every device and run it holds, each in a section of its own."""
    if len(groups) <= 1:
        return f"# gpulab summary: {groups[0][0] if groups else 'unknown device'}"
    names = {(d.get("device") or {}).get("name") for d in results.values()}
    what = f"{len(names)} devices" if len(names) > 1 else "a smoke run and a full-size run"
    return (f"# gpulab summary: {', '.join(label for label, _ in groups)} ({what}: a section each, never mixed)")


def device_sections(groups: list[tuple[str, dict[str, dict]]], reference: dict[str, dict]) -> list[str]:
    """Markdown lines: per group (a heading only when there are several), the not-a-speed-run line, the notebook
    table and the detail tables; the counts note once."""
    md: list[str] = []
    for label, found in groups or [("", {})]:
        if len(groups) > 1:
            md += [f"## {label}", ""]
        not_speed = sorted({w for d in found.values() if (w := not_a_speed_run(d))})
        if not_speed:
            md += [f"{'; '.join(not_speed)}: the timings check that the code runs; no gain, speed verdict or timing "
                   "claim is shown or judged.", ""]
        md += [notebook_table(found), ""]
        if len(groups) <= 1:
            md += [COUNTS_NOTE, ""]
        md += [summary_tables(found, reference), ""]
    if len(groups) > 1:
        md += [COUNTS_NOTE]
    return md[:-1] if md and md[-1] == "" else md
