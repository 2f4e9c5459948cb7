"""What a nunchaku file's header says about itself.

nunchaku's writers (deepcompressor's converter + ``nunchaku.merge_safetensors``, the Wan/SDXL
exporters, diffusers' Nunchaku Lite) put JSON strings in ``__metadata__``: ``model_class``
(``NunchakuFluxTransformer2dModel``...), ``config`` (the diffusers config, ``_class_name``),
``comfy_config`` (``{"model_class": "Flux", "model_config": {...}}``, what ComfyUI-nunchaku
builds the model from), ``quantization_config`` and ``format: "pt"``.  Two quantization
config shapes exist: nunchaku's ``{"method": "svdquant", "rank": 32, "weight": {"dtype":
"int4" | "fp4_e2m1_all", "group_size": 64 | 16}}`` and Nunchaku Lite's ``{"svdq_w4a4":
{"precision", "group_size", "rank", "targets"}, "awq_w4a16": {...}}``.
"""

from __future__ import annotations

from ...findings import json_kind
from ...io.jsontext import parse as parse_json

KEYS = ("model_class", "config", "comfy_config", "quantization_config", "format")
MISSING_COMFY_CONFIG = (
    "ComfyUI-nunchaku's DiT loader reads json.loads(metadata.get('comfy_config')) and fails with "
    '"TypeError: the JSON object must be str, bytes or bytearray, not NoneType"'
)


class Facts:
    """The header's nunchaku facts (None where absent) and what is wrong with them, in words."""

    __slots__ = (
        "present",
        "model_class",
        "diffusers_class",
        "comfy_class",
        "precision",
        "rank",
        "group_size",
        "awq_group_size",
        "problems",
        "comfy_config_ok",
    )

    def __init__(self) -> None:
        self.present: list[str] = []
        self.model_class: str | None = None
        self.diffusers_class: str | None = None
        self.comfy_class: str | None = None
        self.precision: str | None = None
        self.rank: int | None = None
        self.group_size: int | None = None
        self.awq_group_size: int | None = None
        self.problems: list[str] = []
        self.comfy_config_ok = False

    @property
    def any(self) -> bool:
        return bool(self.present)

    def notes(self) -> list[str]:
        """One line naming the model and quantization, then one per problem."""
        if not self.present:
            return [
                "no nunchaku metadata in the header (model_class, config, comfy_config, quantization_config): "
                f"recognised from tensor names only; {MISSING_COMFY_CONFIG}"
            ]
        said = []
        if self.model_class:
            said.append(f"model_class {self.model_class}")
        if self.diffusers_class and self.diffusers_class != self.model_class:
            said.append(f"config {self.diffusers_class}")
        if self.comfy_class:
            said.append(f"comfy_config model_class {self.comfy_class}")
        if self.precision:
            said.append(f"precision {self.precision}")
        if self.rank is not None:
            said.append(f"rank {self.rank}")
        if self.group_size is not None:
            said.append(f"group size {self.group_size}")
        if self.awq_group_size is not None:
            said.append(f"AWQ group size {self.awq_group_size}")
        head = "nunchaku metadata: " + (", ".join(said) if said else "keys " + ", ".join(self.present))
        return [head, *self.problems]


def _json(md: dict, key: str, facts: Facts):
    raw = md.get(key)
    if raw is None:
        return None
    try:
        return parse_json(raw)
    except (TypeError, ValueError) as e:
        facts.problems.append(f"header metadata {key!r} is not JSON ({e})")
        return None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read(md: dict) -> Facts:
    """The facts of ``md`` (the merged ``__metadata__``); never raises."""
    f = Facts()
    if not any(k in md for k in KEYS[:4]):
        return f  # "format": "pt" alone is what every torch safetensors writer puts
    f.present = [k for k in KEYS if k in md]
    mc = md.get("model_class")
    f.model_class = mc if isinstance(mc, str) and mc else None
    cfg = _json(md, "config", f)
    if isinstance(cfg, dict) and isinstance(cfg.get("_class_name"), str):
        f.diffusers_class = cfg["_class_name"]
    comfy = _json(md, "comfy_config", f)
    if "comfy_config" not in md:
        f.problems.append(f"no comfy_config in the header: {MISSING_COMFY_CONFIG}")
    elif isinstance(comfy, dict):
        f.comfy_config_ok = True
        if isinstance(comfy.get("model_class"), str):
            f.comfy_class = comfy["model_class"]
        elif comfy:
            f.problems.append(
                "comfy_config has no model_class: ComfyUI-nunchaku's Flux loader reads comfy_config['model_class'] (KeyError)"
            )
    elif comfy is not None:
        f.problems.append(f"comfy_config is a JSON {json_kind(comfy)}, not an object")
    q = _json(md, "quantization_config", f)
    if isinstance(q, dict):
        _quant(q, f)
    elif "quantization_config" in md and q is not None:
        f.problems.append(f"quantization_config is a JSON {json_kind(q)}, not an object")
    return f


def _quant(q: dict, f: Facts) -> None:
    svdq, awq = q.get("svdq_w4a4"), q.get("awq_w4a16")
    if isinstance(svdq, dict) or isinstance(awq, dict):  # Nunchaku Lite (diffusers / SGLang compact)
        if isinstance(svdq, dict):
            p = svdq.get("precision")
            f.precision = p if isinstance(p, str) else None
            f.rank = _int(svdq.get("rank"))
            f.group_size = _int(svdq.get("group_size"))
        if isinstance(awq, dict):
            f.awq_group_size = _int(awq.get("group_size"))
        return
    w = q.get("weight")
    if isinstance(w, dict):
        dt = w.get("dtype")
        if isinstance(dt, str):
            f.precision = "nvfp4" if "fp4" in dt else ("int4" if dt in ("int4", "sint4") else dt)
        f.group_size = _int(w.get("group_size"))
    f.rank = _int(q.get("rank"))
