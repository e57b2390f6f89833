"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``).

fedcore's docstrings cross-reference in Sphinx's roles (``:func:`run```,
``:class:`~fedcore.config.Config```), which the API reference (mkdocstrings) would show as
written; the hook shows each as its code name alone, as Sphinx would (``~``: the last part).
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:attr|class|data|exc|func|meth|mod|obj):<code>(~?)([^<]*)</code>")


def plain_roles(html: str) -> str:
    """``:role:<code>~a.b.C</code>`` (a role in a rendered docstring) as ``<code>C</code>``."""

    def name(match: re.Match[str]) -> str:
        target = match.group(2)
        return f"<code>{target.rsplit('.', 1)[-1] if match.group(1) else target}</code>"

    return ROLE.sub(name, html)


def on_page_content(html: str, **kwargs: Any) -> str:
    """MkDocs' hook on each page's HTML."""
    return plain_roles(html)
