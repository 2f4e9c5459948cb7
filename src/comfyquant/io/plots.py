"""The PNG outputs (``quantize --report``, ``compare --plot``): matplotlib refused up front
when missing, and each figure written by the one writer (``stage_file``).
matplotlib is imported only here and only when a plot is drawn (the ``plot`` extra)."""

from __future__ import annotations

from ..errors import InputError
from .writer import stage_file


def require_matplotlib(option: str) -> None:
    """Refuse ``option`` (``--report``, ``--plot``) before any work when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            f"{option} draws a PNG plot with matplotlib, which is not installed: pip install 'comfyquant[plot]'"
        ) from None


def pyplot():
    """``matplotlib.pyplot`` on the file-only backend (no display is ever opened)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
