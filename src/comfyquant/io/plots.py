"""The PNG outputs (``quantize --report``, ``compare --plot``): matplotlib refused up front
when missing, and each figure written by the one writer (``stage_file``).
matplotlib is imported only here and only when a plot is drawn (the ``plot`` extra)."""

from __future__ import annotations

from ..errors import InputError
from ..installing import extra_command
from .writer import stage_file


def require_matplotlib(option: str) -> None:
    """Refuse ``option`` (``--report``, ``--plot``) before any work when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(f"{option} draws a PNG plot with matplotlib, which is not installed: {extra_command('plot')}") from None


def pyplot():
    """``matplotlib.pyplot`` on the file-only backend (no display is ever opened)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def title_figure(fig, text: str, fontsize: float = 10) -> None:
    """Give ``fig`` its title and lay it out: the title is centred on the figure (an axes
    title is centred on the axes, so a long one ran off the figure's left edge), wrapped into
    as many lines as keep every line inside the figure, measured on the rendered text, and
    the axes are fitted below it."""
    import textwrap

    fig.tight_layout()
    width = fig.get_figwidth() * fig.dpi
    chars = max(16, int(fig.get_figwidth() * 72 / (fontsize * 0.55)))
    while True:
        lines = [line for part in text.split("\n") for line in (textwrap.wrap(part, chars, break_on_hyphens=False) or [""])]
        title = fig.suptitle("\n".join(lines), fontsize=fontsize)
        box = title.get_window_extent(fig.canvas.get_renderer())
        if (box.x0 >= 0 and box.x1 <= width) or chars <= 16:
            break
        chars = max(16, int(chars * width / box.width) - 1)
    fig.tight_layout()


def stage_figure(fig, path: str, dpi: int = 110) -> str:
    """``fig`` as a PNG staged beside ``path`` (returns the temporary file; the figure is
    closed).  A write error is one line naming ``path``."""
    plt = pyplot()
    try:
        return stage_file(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi))
    except OSError as exc:
        raise InputError(f"{path}: cannot write the plot ({exc.strerror or exc}); nothing was written") from None
    finally:
        plt.close(fig)
