"""The alert runbook (alerts/runbook.md) as HTML pages, one per alert, which the advisor serves
at /runbooks/<AlertName> so that every rule's `runbook_url` (alerts/config.yaml's
`advisor_external_url`) opens the page of its alert, plus an index at /runbooks/.

Pure functions of the runbook's text: `sections` splits it at its `## AlertName` headings,
`page` renders one section (None for a name the runbook does not have), `index` lists them.
The markdown is rendered by markdown-it-py (CommonMark) with raw HTML off, so the runbook's
text is escaped, never interpreted as markup.
"""

from __future__ import annotations

import html
import re
from functools import cache
from importlib import resources

from markdown_it import MarkdownIt

# `## GpuLost`: a section per alert; the name is what the rules call the alert
_HEADING = re.compile(r"^## +([A-Za-z][A-Za-z0-9_]*) *$", re.MULTILINE)
_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;"
    "line-height:1.5}code{background:#f2f2f2;padding:0 .2em}"
)


def runbook_text() -> str:
    """The runbook shipped with the package (alerts/runbook.md)."""
    return resources.files("alerts").joinpath("runbook.md").read_text(encoding="utf-8")


def sections(text: str) -> dict[str, str]:
    """Alert name -> the markdown of its section (without the heading), in the runbook's order."""
    found = list(_HEADING.finditer(text))
    if not found:
        return {}
    ends = [m.start() for m in found[1:]] + [len(text)]
    return {
        m.group(1): text[m.end() : end].strip() + "\n" for m, end in zip(found, ends, strict=True)
    }


def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False})


def _document(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n"
        f"<body>\n{body}</body>\n</html>\n"
    )


def page(text: str, alert: str) -> str | None:
    """The HTML page of `alert`'s section of the runbook `text`, or None if it has none."""
    section = sections(text).get(alert)
    if section is None:
        return None
    body = (
        '<p><a href="./">All runbooks</a></p>\n'
        f"<h1>{html.escape(alert)}</h1>\n{_markdown().render(section)}"
    )
    return _document(f"{alert} - gpu-defrag runbook", body)


def index(text: str, external_url: str) -> str:
    """The HTML index: every alert of the runbook `text`, linked to its page, and the URL the
    rules' runbook_url should start with (the advisor's --web.external-url)."""
    items = "".join(
        f'<li><a href="{html.escape(name, quote=True)}">{html.escape(name)}</a></li>\n'
        for name in sections(text)
    )
    base = html.escape(f"{external_url.rstrip('/')}/runbooks/")
    return _document(
        "gpu-defrag alert runbooks",
        "<h1>gpu-defrag alert runbooks</h1>\n"
        f"<p>One page per alert. Each alert's <code>runbook_url</code> is <code>{base}"
        "&lt;AlertName&gt;</code> (this advisor's <code>--web.external-url</code>; the rules "
        f"take it from alerts/config.yaml's <code>advisor_external_url</code>).</p>\n"
        f"<ul>\n{items}</ul>\n",
    )


@cache
def shipped_pages(external_url: str) -> dict[str, str]:
    """Alert name -> HTML page of the shipped runbook, and "" -> the index."""
    text = runbook_text()
    pages = {name: page(text, name) or "" for name in sections(text)}
    pages[""] = index(text, external_url)
    return pages
