"""Every command the README and the documentation tell a reader to type runs as shown.

Each page's ``bash`` blocks (``tests/doc_blocks.py`` says how blocks are told apart) are run in
order, in one shell per page, in a fresh copy of the project's tracked files, with nothing
substituted: the paths, options and files are the page's own, and a file a command reads must
come from the bundled examples or from an earlier command on the same page. ``comfyquant``,
``python`` and ``pip`` are the installed environment's (the interpreter running the tests comes
first on ``PATH``); a page that makes and activates a virtual environment runs the rest of its
commands in it, as a reader would. A command that exits with another code than the one its
block documents fails the test, naming the page, the line and the command.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import doc_blocks

PAGE_SECONDS = 1500
"""A page's commands stop after this long (a hang is a failure, not a stuck CI run)."""


def _runnable(page: Path) -> list[doc_blocks.Command]:
    return [
        cmd
        for block in doc_blocks.blocks(page)
        if block.lang in doc_blocks.SHELL and block.not_run is None
        for cmd in doc_blocks.commands(block)
    ]


PAGES = [p for p in doc_blocks.pages() if _runnable(p)]


def test_pages_with_commands_are_found():
    """The README's set-up and tour are among the pages run (the block reader works)."""
    names = [p.relative_to(doc_blocks.ROOT).as_posix() for p in PAGES]
    assert "README.md" in names, names
    assert "docs/getting-started.md" in names, names


def test_every_block_says_what_it_holds():
    """A fence names its language; a ``console`` block is a transcript (``$`` lines); a block
    that is not run says why; a command block is ``bash``, so it is run or marked."""
    wrong = []
    for page in doc_blocks.pages():
        for block in doc_blocks.blocks(page):
            where = f"{block.page}:{block.line}"
            if not block.lang:
                wrong.append(f"{where}: a fence without a language (bash to run it, console for a transcript, text)")
            if block.lang == "console" and not any(line.startswith("$ ") for _, line in block.lines):
                wrong.append(f"{where}: a console block without a '$ ' command line")
            if block.lang == "console" and all(line.startswith("$ ") for _, line in block.lines if line.strip()):
                wrong.append(f"{where}: a console block of commands alone: fence it bash (run, or say why not)")
            if block.not_run is not None and not block.not_run:
                wrong.append(f"{where}: 'not run' without a reason")
            if block.not_run is not None and block.lang not in doc_blocks.SHELL:
                wrong.append(f"{where}: 'not run' marks a {block.lang or 'plain'} block, which is never run")
            if block.lang in {"sh", "shell", "bash"} and any(line.startswith("$ ") for _, line in block.lines):
                wrong.append(f"{where}: a shell block with a '$ ' prompt: fence a transcript as console")
    assert not wrong, "\n".join(wrong)


_FROM_INDEX = re.compile(r"pip install\s+(?:-{1,2}[\w-]+(?:[ =]\S+)?\s+)*['\"]?comfyquant\b")
"""``pip install comfyquant`` or ``pip install 'comfyquant[extra]'``: from the package index."""


def test_no_message_installs_comfyquant_from_the_package_index():
    """What the program says to install (a missing extra, comfyquant in ComfyUI's Python) names
    the source, never the package index, which has no comfyquant."""
    said = []
    for path in sorted((doc_blocks.ROOT / "src" / "comfyquant").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _FROM_INDEX.search(line):
                said.append(f"{path.relative_to(doc_blocks.ROOT)}:{number}: {line.strip()}")
    assert not said, "\n".join(said)
    from comfyquant.installing import extra_command, install_command

    for hint in (extra_command("torch"), install_command("python3")):
        assert not _FROM_INDEX.search(hint), hint


def test_no_page_installs_comfyquant_from_the_package_index():
    """comfyquant is installed from its source (a clone or a wheel built from it): the
    package index has no comfyquant, so no page may tell a reader to fetch it from there."""
    said = []
    for page in doc_blocks.pages():
        text = page.read_text(encoding="utf-8")
        for m in _FROM_INDEX.finditer(text):  # across line breaks too
            number = text.count("\n", 0, m.start()) + 1
            said.append(f"{page.relative_to(doc_blocks.ROOT).as_posix()}:{number}: {' '.join(m[0].split())}")
    assert not said, "\n".join(said)


def test_the_index_rule_sees_every_spelling():
    """The rule above catches the ways a page could say it (it is not vacuous)."""
    for line in (
        "pip install comfyquant",
        "/path/venv/bin/pip install 'comfyquant[torch]' torch==2.13.0",
        'python -m pip install --upgrade "comfyquant[diffusers]"',
        "with `pip install\n'comfyquant[plot]'`",
    ):
        assert _FROM_INDEX.search(line), line
    for line in ("pip install -e .", "pip install -e '.[torch]'", "pip install ./comfyquant-0.1.0-py3-none-any.whl"):
        assert not _FROM_INDEX.search(line), line


def _script(commands: list[doc_blocks.Command]) -> str:
    """One shell for the page: each command as written, then its exit code checked."""
    parts = []
    for i, cmd in enumerate(commands):
        parts.append(
            f"echo {shlex.quote(f'$ {cmd.text}')}\n"
            f"{cmd.text}\n"
            f"__rc=$?\n"
            f'if [ "$__rc" -ne {cmd.exit_code} ]; then echo "__DOCS_FAILED__ {i} $__rc"; exit 97; fi\n'
        )
    parts.append("echo __DOCS_DONE__\n")
    return "".join(parts)


def run_page(commands: list[doc_blocks.Command], cwd: Path, timeout: float = PAGE_SECONDS) -> str | None:
    """Run a page's commands in one shell in ``cwd``; None when each exits as documented, else
    the page, line and command that did not, with the last lines it printed."""
    script = cwd.parent / f"{cwd.name}.sh"
    script.write_text(_script(commands))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("VIRTUAL_ENV", None)
    env["PIP_REQUIRE_VIRTUALENV"] = "1"  # a page installs into a venv it made, never into the tests' environment
    proc = subprocess.run(
        ["bash", str(script)],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout
    failed = re.search(r"^__DOCS_FAILED__ (\d+) (\d+)$", out, re.M)
    if failed:
        cmd = commands[int(failed[1])]
        said = out[: failed.start()].rstrip().splitlines()[-15:]
        return f"{cmd.where()}\n  exits {failed[2]}, expected {cmd.exit_code}:\n" + "\n".join(said)
    if "__DOCS_DONE__" not in out:
        return f"the shell stopped early (exit {proc.returncode}):\n{out[-3000:]}"
    return None


def test_a_command_that_exits_otherwise_is_named(tmp_path):
    """The runner keeps one shell per page (a ``cd`` or an activated venv carries over), reads
    a documented exit code, and names the page, line and command that exits otherwise."""
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nmkdir sub && cd sub\ntouch made   # in sub\n```\n\n"
        "<!-- not run: an example -->\n```bash\nfalse\n```\n\n"
        "```bash\ntest -f made\nfalse   # exit 1: as documented\nfalse   # (not run: an example)\nls missing-file\n```\n"
    )
    block_list = doc_blocks.blocks(page, root=tmp_path)
    assert [b.not_run for b in block_list] == [None, "an example", None]
    commands = [c for b in block_list if b.not_run is None for c in doc_blocks.commands(b)]
    assert [(c.line, c.exit_code) for c in commands] == [(2, 0), (3, 0), (12, 0), (13, 1), (15, 0)]
    work = tmp_path / "work"
    work.mkdir()
    said = run_page(commands, work)
    assert said is not None and said.startswith("page.md:15: ls missing-file\n  exits 2, expected 0:"), said
    alone = run_page(commands[2:4], _fresh(tmp_path / "alone"), timeout=60)  # no cd into sub first
    assert alone is not None and alone.startswith("page.md:12: test -f made\n  exits 1, expected 0:"), alone
    assert run_page(commands[:4], _fresh(tmp_path / "again"), timeout=60) is None


def _fresh(folder: Path) -> Path:
    folder.mkdir()
    return folder


@pytest.mark.needs_torch
@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(doc_blocks.ROOT).as_posix() for p in PAGES])
def test_documented_commands_run_as_shown(page, tmp_path):
    commands = _runnable(page)
    clone = tmp_path / "clone"
    doc_blocks.fresh_copy(clone)
    said = run_page(commands, clone)
    if said:
        pytest.fail(said)
