"""The docs site's own rules, as MkDocs hooks (named in mkdocs.yml): links from a page to the
sources outside docs/ (``../collectives/api/communicator.py``), which work where the pages are
read in the repository, point at the repository (``repo_url``) on the site, or become plain
text where no repository is configured; and a raw Sphinx role left in a docstring
(``:class:`...```) is a warning, which ``mkdocs build --strict`` turns into a failed build."""

from __future__ import annotations

import logging
import posixpath
import re

# MkDocs counts the warnings of its own loggers ("mkdocs.*") in --strict mode.
log = logging.getLogger("mkdocs.hooks.collectives")

# a role as Markdown leaves it in HTML: its name, then the target in backticks (as written)
# or in <code> (as rendered)
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|ref|term|const):(?:`|<code>)")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)


def source_link(target: str, page_uri: str, repo_url: str | None) -> str | None:
    """Where a link to ``target`` from page ``page_uri`` should point on the site: None where
    it stays (a page, an anchor, an address), the repository's file where ``target`` lies
    outside docs/ and ``repo_url`` is set, else "" (no link: the text alone)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path, _, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), path))
    if not resolved.startswith("../"):
        return None  # inside docs/: MkDocs checks it
    inside_repo = resolved[len("../"):] + ("/" if path.endswith("/") else "")
    if not repo_url:
        return ""
    kind = "tree" if path.endswith("/") else "blob"
    return f"{repo_url.rstrip('/')}/{kind}/HEAD/{inside_repo}" + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown: str, page, config, files) -> str:
    repo_url = config.get("repo_url")
    fences = [(m.start(), m.end()) for m in FENCE.finditer(markdown)]

    def replace(match: re.Match) -> str:
        if any(a <= match.start() < b for a, b in fences):
            return match.group(0)
        where = source_link(match["target"], page.file.src_uri, repo_url)
        if where is None:
            return match.group(0)
        return f"[{match['text']}]({where})" if where else match["text"]

    return LINK.sub(replace, markdown)


def on_page_content(html: str, page, config, files) -> str:
    for match in ROLE.finditer(html):
        context = re.sub(r"<[^>]+>", "`", html[match.start():match.start() + 120]).split("\n")[0]
        log.warning(f"{page.file.src_uri}: a raw Sphinx role in the rendered page: {context!r}; "
                    "write the name in backticks (NumPy docstring style)")
    return html
