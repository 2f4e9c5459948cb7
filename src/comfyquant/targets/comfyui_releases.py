"""ComfyUI's releases as groups that load quantized files alike, and each group's facts.

A group is a run of releases whose deciding code (the definitions of ComfyUI's single-layer
loading path in ``comfy/quant_ops.py``, ``comfy/float.py``, ``comfy/ops.py``,
``comfy/utils.py``, ``comfy/sd.py``, ``comfy/model_detection.py``,
``comfy/model_management.py`` and ``BaseModel.load_model_weights``) is byte-identical and
which name the same comfy-kitchen: ``fingerprint`` is the digest of that code, and
``tests/test_comfyui_releases.py`` recomputes every group from the releases' sources.  Per
group: the comfy-kitchen it runs with (``==`` a pin; ``>=`` a minimum, the release then runs
with whatever newer one is installed; none before 0.8.0, whose layouts are ComfyUI's own), the
marker forms it reads, the formats its ``QUANT_ALGOS`` (``QUANT_FORMAT_MIXINS`` in 0.3.68)
knows, and what it raises on a layer of a format it does not know, as running the release
raised it.  No torch: ``check`` reads these tables.
"""

from __future__ import annotations

HEADER = "header map"
TENSOR = ".comfy_quant tensors"

FP8 = ("float8_e4m3fn",)
KITCHEN_08 = (*FP8, "float8_e5m2", "nvfp4")
MX = (*KITCHEN_08, "mxfp8")
INT8 = (*MX, "int8_tensorwise")
W4A4 = (*INT8, "convrot_w4a4")
W4A8 = (*W4A4, "asym_w4a8_int8")


class ReleaseGroup:
    """Releases that load every file alike (see the module docstring)."""

    __slots__ = ("releases", "kitchen", "pinned", "markers", "formats", "unknown", "fingerprint")

    def __init__(
        self,
        releases: tuple[str, ...],
        kitchen: str | None,
        pinned: bool,
        markers: tuple[str, ...],
        formats: tuple[str, ...],
        unknown: tuple[str, str],
        fingerprint: str,
    ) -> None:
        self.releases = releases
        self.kitchen = kitchen
        """The comfy-kitchen release its requirements name (None: it runs without one)."""
        self.pinned = pinned
        """True: ``kitchen`` is pinned exactly; False: a minimum (``comfy-kitchen>=``)."""
        self.markers = markers
        self.formats = formats
        self.unknown = unknown
        """(exception, message with ``{format}``) raised loading a layer of a format it lacks."""
        self.fingerprint = fingerprint

    @property
    def first(self) -> str:
        return self.releases[0]

    @property
    def kitchen_text(self) -> str:
        """``comfy-kitchen 0.2.31``, ``comfy-kitchen >= 0.2.8`` or ``no comfy-kitchen``."""
        if self.kitchen is None:
            return "no comfy-kitchen"
        return f"comfy-kitchen {self.kitchen}" if self.pinned else f"comfy-kitchen >= {self.kitchen}"

    def to_dict(self) -> dict:
        return {
            "releases": list(self.releases),
            "comfy_kitchen": self.kitchen,
            "comfy_kitchen_pinned": self.pinned,
            "markers": list(self.markers),
            "formats": list(self.formats),
        }


_KEY_ERROR = ("KeyError", "'{format}'")
_BOTH = (HEADER, TENSOR)


def _g(releases: str, kitchen: str | None, pinned: bool, markers, formats, fingerprint: str, unknown=_KEY_ERROR) -> ReleaseGroup:
    return ReleaseGroup(tuple(releases.split()), kitchen, pinned, markers, formats, unknown, fingerprint)


GROUPS: tuple[ReleaseGroup, ...] = (
    _g("0.3.68", None, False, (HEADER,), FP8, "62d40d12b89a207f"),
    _g("0.3.76", None, False, (HEADER,), FP8, "8d3c02a3b6781a69"),
    _g("0.4.0", None, False, _BOTH, FP8, "3499a3812164e407"),
    _g("0.5.1 0.6.0 0.7.0", None, False, _BOTH, FP8, "a4eb2c1591de6acf"),
    _g("0.8.2", "0.2.5", False, _BOTH, KITCHEN_08, "a64f879f48591f72"),
    _g("0.9.2", "0.2.6", False, _BOTH, KITCHEN_08, "549a8526895e4795"),
    _g("0.10.0", "0.2.7", False, _BOTH, KITCHEN_08, "e8b317d976f4e7bc"),
    _g("0.11.1", "0.2.7", False, _BOTH, KITCHEN_08, "5dcd76961cfb4168"),
    _g("0.12.3", "0.2.7", False, _BOTH, KITCHEN_08, "0ac8bb354270afd8"),
    _g("0.13.0", "0.2.7", False, _BOTH, KITCHEN_08, "7ab5be75e6edfb0b"),
    _g("0.14.1", "0.2.7", False, _BOTH, KITCHEN_08, "b327cff035c20fca"),
    _g("0.15.1", "0.2.7", False, _BOTH, KITCHEN_08, "6e5fbc15b0768955"),
    _g("0.16.4", "0.2.7", False, _BOTH, KITCHEN_08, "d18b57e6c8942340"),
    _g("0.17.0", "0.2.8", False, _BOTH, KITCHEN_08, "aeca95f77f343fcd"),
    _g("0.18.1", "0.2.8", False, _BOTH, MX, "f31a16115e09dd2b"),
    _g("0.19.3", "0.2.8", False, _BOTH, MX, "874ecebfcf81729f"),
    _g("0.20.1", "0.2.8", False, _BOTH, MX, "430b5fee341444c8"),
    _g("0.21.1", "0.2.8", False, _BOTH, MX, "15f9ad4cc11cbed3"),
    _g("0.22.0", "0.2.8", False, _BOTH, MX, "dfb1027486b6a3d4"),
    _g("0.23.0 0.24.0", "0.2.10", True, _BOTH, MX, "2f81e12beb743f4d"),
    _g("0.25.0 0.26.0", "0.2.10", True, _BOTH, MX, "0cd051fc7f2f8777"),
    _g("0.27.0", "0.2.16", True, _BOTH, INT8, "477328e3afe0ce1d"),
    _g("0.28.0", "0.2.20", True, _BOTH, W4A4, "5c483ab14eee092b"),
    _g("0.29.0", "0.2.22", True, _BOTH, W4A4, "f0415ee279840023"),
    _g("0.30.0", "0.2.26", True, _BOTH, W4A4, "db4e1ee0d00038e2"),
    _g("0.31.0", "0.2.28", True, _BOTH, W4A8, "f4ba3c38cb6dca1e"),
    _g("0.32.0", "0.2.30", True, _BOTH, W4A8, "94f61ca080016b61"),
    _g("0.33.0", "0.2.31", True, _BOTH, W4A8, "ce01bc8f777c3a53"),
)
"""Every group, oldest first: the releases 0.3.68 (the first that reads
``_quantization_metadata``) to 0.33.0."""

RELEASES: tuple[str, ...] = tuple(r for g in GROUPS for r in g.releases)
NEWEST = GROUPS[-1]


def version_key(version: str) -> tuple[int, ...]:
    """``"0.31.0"`` -> ``(0, 31, 0)``; a shorter version compares as its zero-padded form."""
    parts = tuple(int(p) for p in version.split("."))
    return parts + (0,) * (3 - len(parts))


def group_of(release: str) -> ReleaseGroup:
    for g in GROUPS:
        if release in g.releases:
            return g
    raise KeyError(release)
