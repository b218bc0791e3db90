"""A page's stylesheet cut to what it uses: JupyterLab's CSS rules and variables that no element of the page needs are
dropped (its notice kept)."""
from __future__ import annotations

import re

_CODE_BLOCKS = re.compile(r"<(script|style)\b[^>]*>.*?</\1>", re.S | re.I)

_STYLE = re.compile(r"(<style[^>]*>)(.*?)(</style>)", re.S)
_CLASS_ATTR = re.compile(r"""\bclass=["']([^"']*)["']""")
_NOT = re.compile(r":not\([^)]*\)")
_SEL_CLASS = re.compile(r"\.(-?[_a-zA-Z][\w-]*)")


CSS_NOTICE = ("/* JupyterLab's stylesheet (Copyright (c) Jupyter Development Team, Modified BSD License), "
              "less the rules this page does not use */")


def _used_rules(rules: list, classes: set[str]) -> list:
    """The rules of a parsed stylesheet that can match an element of the page: each selector's classes (outside
    :not()) all among `classes`; @media and @supports blocks pruned the same way, other at-rules kept."""
    import tinycss2

    kept = []
    for r in rules:
        if r.type == "qualified-rule":
            sels = tinycss2.serialize(r.prelude).split(",")
            if any(set(_SEL_CLASS.findall(_NOT.sub("", sel))) <= classes for sel in sels):
                kept.append(r)
        elif r.type == "at-rule" and r.lower_at_keyword in ("media", "supports") and r.content is not None:
            inner = _used_rules(tinycss2.parse_rule_list(r.content, skip_comments=True, skip_whitespace=True),
                                classes)
            if inner:
                r.content = [tok for rule in inner for tok in (rule, tinycss2.ast.WhitespaceToken(0, 0, "\n"))]
                kept.append(r)
        elif r.type == "at-rule":
            kept.append(r)
    return kept
_VAR_USE = re.compile(r"var\(\s*(--[\w-]+)")


def _without_unused_vars(rules: list, body: str) -> str:
    """The rules serialized, without the custom properties (--jp-icon-...: url(data:...)) that no rule or page
    element reads, directly or through another property."""
    import tinycss2

    decls: dict[int, list] = {}
    defs: dict[str, list[str]] = {}
    used = set(_VAR_USE.findall(body))
    for i, r in enumerate(rules):
        if r.type != "qualified-rule":
            used |= set(_VAR_USE.findall(tinycss2.serialize([r])))
            continue
        decls[i] = [d for d in tinycss2.parse_declaration_list(r.content, skip_comments=True,
                                                               skip_whitespace=True) if d.type == "declaration"]
        for d in decls[i]:
            value = tinycss2.serialize(d.value)
            if d.name.startswith("--"):
                defs.setdefault(d.name, []).append(value)
            else:
                used |= set(_VAR_USE.findall(value))
    todo = list(used)
    while todo:
        for value in defs.get(todo.pop(), []):
            for name in set(_VAR_USE.findall(value)) - used:
                used.add(name)
                todo.append(name)
    out = []
    for i, r in enumerate(rules):
        if i not in decls:
            out.append(tinycss2.serialize([r]))
            continue
        keep = [d for d in decls[i] if not d.name.startswith("--") or d.name in used]
        if keep:
            inner = "; ".join(f"{d.name}: {tinycss2.serialize(d.value).strip()}"
                              + (" !important" if d.important else "") for d in keep)
            out.append(f"{tinycss2.serialize(r.prelude).strip()} {{ {inner} }}")
    return "\n".join(out)


def prune_css(page: str) -> str:
    """`page` with each stylesheet cut to the rules that can match one of its elements: nbconvert embeds all
    of JupyterLab's CSS (about 260 kB) in every page, most of it for widgets and panels a page does not have."""
    try:
        import tinycss2
    except ImportError:  # it comes with nbconvert's sanitizer; without it the page keeps its whole CSS
        return page
    body = _CODE_BLOCKS.sub("", page)
    classes = {c for m in _CLASS_ATTR.finditer(body) for c in m.group(1).split()}
    blocks = [m.group(2) for m in _STYLE.finditer(page)]
    big = {i: _used_rules(tinycss2.parse_stylesheet(css, skip_comments=True, skip_whitespace=True), classes)
           for i, css in enumerate(blocks) if len(css) > 10_000}  # the page's own small blocks: as written
    kept = [tinycss2.serialize(big[i]) if i in big else css for i, css in enumerate(blocks)]
    at = iter(range(len(blocks)))

    def prune(m: re.Match) -> str:
        i = next(at)
        if i not in big:
            return m.group(0)
        others = body + "".join(k for j, k in enumerate(kept) if j != i)  # a variable may be read in another block
        return f"{m.group(1)}\n{CSS_NOTICE}\n{_without_unused_vars(big[i], others)}\n{m.group(3)}"

    return _STYLE.sub(prune, page)
