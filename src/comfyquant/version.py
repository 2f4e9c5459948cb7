"""The package version, stated once (base layer: stamps, ``--version`` and ``comfyquant.__version__`` read it)."""

__version__ = "0.1.0"
