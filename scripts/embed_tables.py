"""Refresh the tables a Markdown page quotes from generated files, so the page shows exactly what the commands wrote.

    python scripts/embed_tables.py docs/results/README.md

Every block of the form

    <!-- include: fmnist-heterog10/paper.md -->
    ...anything...
    <!-- end include -->

gets, between its two markers, the current content of the named file (relative to the page's folder). A missing
file is an error: the page must not quote a table that no command wrote.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

BLOCK = re.compile(r"(<!-- include: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- end include -->)", re.DOTALL)


def embed(page: Path) -> int:
    text = page.read_text()
    count = 0

    def replace(match: re.Match) -> str:
        nonlocal count
        source = page.parent / match.group("path")
        if not source.is_file():
            raise FileNotFoundError(f"{page}: {source} (quoted by an include block) does not exist")
        count += 1
        return match.group(1) + source.read_text().rstrip("\n") + "\n" + match.group(4)

    page.write_text(BLOCK.sub(replace, text))
    return count


if __name__ == "__main__":
    for name in sys.argv[1:] or ["docs/results/README.md"]:
        print(f"{name}: {embed(Path(name))} tables refreshed")
