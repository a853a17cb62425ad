"""Chromium for the page tests, as launch/test.sh installs it (Debian's package), driven
by Playwright; and the data a page embeds, read back from its index.html."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

CHROMIUM = Path(os.environ.get("BEYONDPAR_CHROMIUM", "/usr/bin/chromium"))
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_PAGE_DATA = re.compile(r'<script id="page-data" type="application/json">(.*?)</script>', re.S)


def missing() -> str | None:
    """Why the browser tests cannot run here (a skip's reason), or None when they can."""
    if shutil.which(str(CHROMIUM)) is None:
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


def launch(playwright):
    """Headless Chromium from `CHROMIUM`, with the flags every page test uses."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)


def page_data(text: str) -> dict:
    """The JSON a page embeds, from the text of its index.html."""
    return json.loads(_PAGE_DATA.search(text).group(1))


def embedded(folder: Path) -> dict:
    """The JSON that `folder`'s index.html embeds."""
    return page_data((Path(folder) / "index.html").read_text())
