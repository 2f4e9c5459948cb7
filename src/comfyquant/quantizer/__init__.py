"""Write consistent Comfy quantized checkpoints from dense weights, with a quality report.

* ``params``   format names and short names -> the format package's ``Params`` (refusals list the allowed values);
* ``rules``    TOML rules files: layer-name globs -> format or ``keep``, most specific wins;
* ``layout``   planned tensors from the format descriptions, validated by the format packages;
  virtual checkpoints for the runtime profiles;
* ``plan``     per-layer decisions with reasons, judged as a whole before any computing;
* ``work``     one layer: read, encode, measure (in this process or a worker);
* ``runner``   streaming into temporary files with ``--jobs`` processes, check, commit;
* ``report``   JSON document, PNG plot, text;
* ``options``  what a ``quantize``/``convert`` run was asked to do, one frozen value from the command line or the API;
* ``api``      ``quantize`` and ``convert``, and ``run`` (the options object -> the run).

The public functions are ``comfyquant.quantize`` and ``comfyquant.convert`` (this package is
named ``quantizer`` so that those names stay plain functions).
"""

from __future__ import annotations


def __getattr__(name: str):
    if name in ("quantize", "convert", "Result"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
