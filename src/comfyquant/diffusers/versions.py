"""Which diffusers this package is written against, checked before anything else runs.

The loader calls diffusers' single-file converters and relies on what they do to a weight
(chunk, split, ``[a:b]``, cat along rows; which keys they pop or rename) and on
``SINGLE_FILE_LOADABLE_CLASSES``: private behaviour that changes between releases.  So a
release not listed here is refused in one line instead of loading a model subtly wrong.
"""

from __future__ import annotations

from ..installing import extra_command
from ..torch.tensors import LoadError

SUPPORTED = ("0.42.",)
"""Version prefixes of diffusers whose converters the loader and its tests cover (0.42.1)."""


def require_diffusers():
    """The imported ``diffusers`` module, or ``LoadError`` saying what to install."""
    try:
        import diffusers
    except ImportError:
        raise LoadError(f"comfyquant.diffusers needs diffusers 0.42.x: {extra_command('diffusers')}") from None
    version = str(getattr(diffusers, "__version__", "unknown"))
    if not version.startswith(SUPPORTED):
        raise LoadError(
            f"comfyquant.diffusers supports diffusers {', '.join(s + 'x' for s in SUPPORTED)}, "
            f"this is diffusers {version}: pip install 'diffusers==0.42.1'"
        )
    return diffusers
