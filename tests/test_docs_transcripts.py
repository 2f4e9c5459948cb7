"""What the documentation shows ``check`` and ``inspect`` printing on a bundled example is what
they print.

A ``console`` block is a transcript (``tests/doc_blocks.py``): ``$ command`` lines, each followed
by its output. Every transcript of ``comfyquant check`` or ``comfyquant inspect`` whose files are
all in this repository is run from the project's root and compared with its output, line for
line. A transcript may leave parts out, and says where: a line that is only ``...`` stands for
any number of lines, and ``...`` inside a line for any text there (a table's wide columns).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest

import doc_blocks

READERS = ("check", "inspect")
"""The commands whose transcripts are compared: they only read, and the examples are bundled."""


@dataclass(frozen=True)
class Transcript:
    page: str
    line: int
    argv: tuple[str, ...]
    shown: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {' '.join(self.argv)}"


def _transcripts() -> list[Transcript]:
    found = []
    for page in doc_blocks.pages():
        for block in doc_blocks.blocks(page):
            if block.lang != "console":
                continue
            lines = list(block.lines)
            starts = [i for i, (_, text) in enumerate(lines) if text.startswith("$ ")]
            for j, i in enumerate(starts):
                argv = tuple(shlex.split(lines[i][1][2:], comments=True))
                if len(argv) < 3 or argv[0] != "comfyquant" or argv[1] not in READERS:
                    continue
                files = [a for a in argv[2:] if not a.startswith("-")]
                if not files or not all((doc_blocks.ROOT / f).exists() for f in files):
                    continue  # a reader's own file, shown for its output only
                end = starts[j + 1] if j + 1 < len(starts) else len(lines)
                shown = tuple(text.rstrip() for _, text in lines[i + 1 : end])
                found.append(Transcript(block.page, lines[i][0], argv, shown))
    return found


def _pattern(shown: tuple[str, ...]) -> re.Pattern[str]:
    """A transcript as a pattern over the whole output: ``...`` alone on a line is any number
    of lines, ``...`` within a line any text in that line."""
    parts = []
    for line in shown:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(re.escape(line).replace(re.escape("..."), r"[^\n]*") + r"\n")
    return re.compile("".join(parts))


TRANSCRIPTS = _transcripts()


def test_the_tour_is_among_the_transcripts():
    """The README's first transcript (check on the bundled broken file) is found and compared."""
    assert any(t.page == "README.md" and t.argv[1] == "check" for t in TRANSCRIPTS), [str(t) for t in TRANSCRIPTS]


def test_a_transcript_that_leaves_out_lines_says_where():
    shown = ("targets:", "...", "  comfyui        ... loads")
    assert _pattern(shown).fullmatch("targets:\n  sglang  FAILS\n  x\n  comfyui        here loads\n")
    assert not _pattern(("targets:", "  comfyui  loads")).fullmatch("targets:\n  sglang  FAILS\n  comfyui  loads\n")


@pytest.mark.parametrize("transcript", TRANSCRIPTS, ids=str)
def test_the_transcript_is_what_the_command_prints(transcript):
    done = subprocess.run(
        [sys.executable, "-m", "comfyquant", *transcript.argv[1:]],
        cwd=doc_blocks.ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    printed = "\n".join(line.rstrip() for line in (done.stdout + done.stderr).splitlines()) + "\n"
    assert _pattern(transcript.shown).fullmatch(printed), f"{transcript} prints:\n{printed}"
