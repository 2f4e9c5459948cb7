"""Write consistent Comfy quantized checkpoints from dense weights, with a quality report.

* :mod:`.params`   format names and the parameters each format takes (refusals list the allowed values);
* :mod:`.rules`    TOML rules files: layer-name globs -> format or ``keep``, most specific wins;
* :mod:`.layout`   planned tensors from the format descriptions, virtual checkpoints for the checker;
* :mod:`.plan`     per-layer decisions with reasons, judged as a whole before any computing;
* :mod:`.work`     one layer: read, encode, measure (in this process or a worker);
* :mod:`.runner`   streaming into temporary files with ``--jobs`` processes, check, commit;
* :mod:`.report`   JSON document, PNG plot, text;
* :mod:`.api`      :func:`quantize` and :func:`convert`.

``comfyquant.quantize`` is both this package and the API function: the package module is
callable (``comfyquant.quantize(IN, OUT, format="w4a8")``).  Importing a submodule makes
Python bind the package to the parent's ``quantize`` attribute, so a plain function of that
name could never stay there; a callable module keeps both meanings working.
"""

from __future__ import annotations

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .api import quantize

        return quantize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


def __getattr__(name: str):
    if name in ("quantize", "convert", "Result"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
