"""The shell commands the documentation tells a reader to type, read from its Markdown pages.

The pages are ``README.md`` and every ``docs/**/*.md``. A fenced block's language says what it
holds:

- ``bash`` (or ``sh``, ``shell``): commands a reader types, in order. They are run by
  ``tests/test_docs_commands.py`` exactly as written, unless the block is preceded by a
  ``<!-- not run: REASON -->`` line saying why it cannot run here (the network, a GPU, a
  ComfyUI install, a file no command writes).
- ``console``: a transcript, ``$ command`` lines followed by what they print; shown, not run.
- ``text``, ``python``, ``json``, ``toml`` ...: not commands.

A command is expected to exit 0; a trailing comment naming another code (``# ... exit 1``)
says which code it exits with (``check`` exits 1 on a file with errors). A trailing comment
holding ``(not run: REASON)`` leaves that one command out (the README's ``bash .ci/run``: CI
itself, which runs these pages).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHELL = {"bash", "sh", "shell"}
"""The fence languages of blocks that hold commands to run."""

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[^\s`]*)")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.*?)\s*-->\s*$")
_EXIT = re.compile(r"#.*\bexit (?:code )?(?P<code>\d+)\b")
_COMMAND_NOT_RUN = re.compile(r"#.*\(not run: (?P<reason>[^)]+)\)")


@dataclass(frozen=True)
class Block:
    page: str
    """The page, relative to the project's root."""
    line: int
    """The line of the opening fence (1-based)."""
    lang: str
    lines: tuple[tuple[int, str], ...]
    """The block's lines with their line numbers, the fence's indentation removed."""
    not_run: str | None
    """The reason of a preceding ``<!-- not run: REASON -->`` line, else None."""


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    exit_code: int

    def where(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def pages() -> list[Path]:
    """README.md, then the documentation pages in name order."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md", *docs]


def blocks(page: Path, root: Path = ROOT) -> list[Block]:
    """Every fenced block of a page (named relative to ``root``)."""
    rel = page.relative_to(root).as_posix()
    text = page.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(text):
        m = _FENCE.match(text[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        start = i
        prev = next((text[j] for j in range(start - 1, -1, -1) if text[j].strip()), "")
        reason = _NOT_RUN.match(prev)
        body = []
        i += 1
        while i < len(text) and not (text[i].strip().startswith(fence) and text[i].strip().strip(fence[0]) == ""):
            body.append((i + 1, text[i][indent:] if text[i][:indent].strip() == "" else text[i]))
            i += 1
        found.append(Block(rel, start + 1, m["lang"].lower(), tuple(body), reason["reason"] if reason else None))
        i += 1
    return found


def commands(block: Block) -> list[Command]:
    """The commands of a shell block: one per line, ``\\``-continued lines joined; blank lines,
    lines that are only a comment and commands marked ``(not run: REASON)`` are skipped."""
    out = []
    pending: list[str] = []
    first = 0
    for number, raw in block.lines:
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            first = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        text = "\n".join(pending)
        pending = []
        if _COMMAND_NOT_RUN.search(text):
            continue
        code = _EXIT.search(text)
        out.append(Command(block.page, first, text, int(code["code"]) if code else 0))
    return out


def fresh_copy(dest: Path) -> None:
    """The project's tracked files as the working tree has them: what a fresh clone holds."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the working tree, not yet committed
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
