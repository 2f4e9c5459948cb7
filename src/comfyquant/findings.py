"""Findings: what is wrong with a checkpoint, as data.

A finding names a stable rule code, a severity, the layer and tensor, what was expected and
what was found, the likely cause and the fix.  Rendering (text, JSON) lives elsewhere.
``targets`` lists the runtimes the defect breaks; empty means it matters everywhere.
"""

from __future__ import annotations

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}


class Rule:
    __slots__ = ("code", "severity", "title")

    def __init__(self, code: str, severity: str, title: str) -> None:
        self.code = code
        self.severity = severity
        self.title = title


# Every rule code comfyquant emits, with its default severity.  Codes are stable: tools and
# CI scripts match on them.  Target rules (``sglang.*`` etc.) are listed in check/targets.
RULES: dict[str, Rule] = {
    r.code: r
    for r in (
        # container
        Rule("C001", ERROR, "tensor byte span does not match dtype x shape"),
        Rule("C002", ERROR, "tensor data offsets outside the file's data area"),
        Rule("C003", ERROR, "tensors overlap in the data area"),
        Rule("C004", ERROR, "gap or trailing bytes in the data area (safetensors refuses the file)"),
        Rule("C005", ERROR, "unknown dtype string"),
        Rule("C006", ERROR, "malformed tensor entry in the header"),
        Rule("C007", ERROR, "__metadata__ value is not a string"),
        Rule("C008", ERROR, "header longer than the safetensors library's 100,000,000-byte limit"),
        Rule("C009", ERROR, "header unreadable: file too short, header length out of range, not UTF-8 or not a JSON object"),
        Rule("C010", ERROR, "tensor name present in more than one shard"),
        Rule("C011", ERROR, "shard named by the index (or by the shard file names) is missing or unreadable"),
        Rule("C012", ERROR, "index maps a tensor to the wrong shard"),
        Rule("C013", WARNING, "tensor not listed in the index"),
        Rule("C014", ERROR, "index lists a tensor no shard contains"),
        Rule("C015", INFO, "folder member skipped or read once (unreadable beside an index, or a link to another member)"),
        Rule("C016", ERROR, "header JSON the safetensors library refuses that Python's JSON reads (a repeated key, NaN, ...)"),
        # markers
        Rule("M001", ERROR, "marker tensor is not UTF-8 JSON"),
        Rule("M002", ERROR, "marker is not a JSON object"),
        Rule("M003", WARNING, "marker tensor stored with a dtype other than U8 or not 1-D"),
        Rule("M010", ERROR, "_quantization_metadata is not valid JSON"),
        Rule("M011", ERROR, "_quantization_metadata is not a JSON object"),
        Rule("M012", ERROR, "_quantization_metadata has no layers object"),
        Rule("M013", ERROR, "_quantization_metadata layer entry is not an object"),
        Rule("M014", INFO, "_quantization_metadata has no format_version"),
        Rule("M020", ERROR, "header and tensor markers disagree"),
        Rule("M021", ERROR, "markers for one layer disagree across shards"),
        Rule("M022", ERROR, "header marker names a layer that has no tensors"),
        Rule("M023", ERROR, "quantized weight has no marker"),
        Rule("M024", WARNING, "files disagree on quant_format"),
        Rule("M030", ERROR, "marker has no format key"),
        Rule("M031", ERROR, "unknown format name"),
        Rule("M032", ERROR, "converter-only format no runtime loads"),
        Rule("M033", WARNING, "nested params object in the marker"),
        Rule("M034", WARNING, "marker key starting with an underscore"),
        Rule("M035", ERROR, "marker key has a value the format does not allow"),
        Rule("M036", WARNING, "marker key left to its default"),
        Rule("M040", ERROR, "two layers map to the same name after prefix mapping"),
        # layers
        Rule("L001", ERROR, "required tensor missing"),
        Rule("L002", ERROR, "tensor has the wrong dtype"),
        Rule("L003", ERROR, "tensor has the wrong shape"),
        Rule("L004", ERROR, "tensor has the wrong dtype and shape"),
        Rule("L005", ERROR, "layer geometry violates the format's constraints"),
        Rule("L006", ERROR, "tensor not allowed in this variant of the format"),
        Rule("L007", WARNING, "tensor the format does not define"),
        Rule("L008", ERROR, "cannot infer the layer's geometry"),
        Rule("L009", ERROR, "quantization tensor without a weight"),
        Rule("L010", ERROR, "MoE expert bank whose num_experts is not the weight's expert count (info: how a bank was read)"),
        # foreign layouts (dialects)
        Rule("F001", INFO, "layers written in another writer's layout (a dialect)"),
        Rule("F002", WARNING, "layer of a dialect that cannot become a Comfy layer"),
        Rule("F003", INFO, "what only the tensor data can tell about a dialect (check --deep)"),
        Rule("F004", WARNING, "what the tensor data says about a dialect's layers (check --deep)"),
        # deep (tensor values)
        Rule("D001", ERROR, "scale contains NaN or Inf"),
        Rule("D002", ERROR, "scale contains zeros"),
        Rule("D003", ERROR, "scale contains negative values"),
        Rule("D004", ERROR, "codebook is not sorted ascending"),
        Rule("D005", ERROR, "codebook contains NaN or Inf"),
        Rule("D006", WARNING, "tensor is all zeros"),
        Rule("D007", ERROR, "tensor values contain NaN or Inf"),
        Rule("D008", ERROR, "weight values a runtime's value cast to the format's dtype changes"),
        Rule("D009", ERROR, "every scale at its dtype's largest value (overflowed and clipped)"),
        Rule("D010", ERROR, "a W4A8 correction ComfyUI drops, measured (error when its output is garbage)"),
        Rule("D011", ERROR, "W4A8 group scales sized for a codebook on a layer without one"),
    )
}


ONE_RUNTIME = {"D010": "comfyui"}
"""Findings that speak of one runtime's computation only (D010: the W4A8 correction ComfyUI
drops): another runtime's violation on the same tensor never attaches to them."""


DEEP_MEASURES = "check --deep measures"
"""The words a header-only finding uses to promise a measurement of its tensor's values:
``check --deep`` gives every finding that says them the value it measured (``measured``)."""


class Finding:
    """One defect.  ``expected``/``actual`` are short human strings such as ``F32 (16, 32)``;
    ``measured`` is what ``check --deep`` measured on the tensor (``{"quantity": ..., "value": ...}``)
    for a finding that promises or rests on a measurement, else None."""

    __slots__ = (
        "code",
        "message",
        "layer",
        "tensor",
        "expected",
        "actual",
        "cause",
        "fix",
        "severity",
        "targets",
        "file",
        "measured",
    )

    def __init__(
        self,
        code: str,
        message: str,
        layer: str | None = None,
        tensor: str | None = None,
        expected: str | None = None,
        actual: str | None = None,
        cause: str | None = None,
        fix: str | None = None,
        severity: str = "",
        targets: list[str] | None = None,
        file: str | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.layer = layer
        self.tensor = tensor
        self.expected = expected
        self.actual = actual
        self.cause = cause
        self.fix = fix
        if not severity:
            rule = RULES.get(code)
            severity = rule.severity if rule else ERROR
        self.severity = severity
        self.targets = targets if targets is not None else []
        self.file = file
        self.measured: dict | None = None

    def __repr__(self) -> str:
        return f"Finding({self.code}, {self.severity}, {self.layer!r}, {self.message!r})"

    def to_dict(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity,
            "layer": self.layer,
            "tensor": self.tensor,
            "expected": self.expected,
            "actual": self.actual,
            "cause": self.cause,
            "fix": self.fix,
            "message": self.message,
            "targets": list(self.targets),
            "file": self.file,
            "measured": dict(self.measured) if self.measured else None,
        }

    def with_layer(self, layer: str, prefix: str) -> Finding:
        """Copy of a cached layer-relative finding bound to a concrete layer."""
        tensor = f"{prefix}.{self.tensor}" if self.tensor else None
        return Finding(
            self.code,
            self.message.replace("{layer}", layer),
            layer,
            tensor,
            self.expected,
            self.actual,
            self.cause,
            self.fix,
            self.severity,
            list(self.targets),
            self.file,
        )


_JSON_KINDS = {"dict": "object", "list": "array", "str": "string", "int": "number", "float": "number", "bool": "boolean"}


def json_kind(value) -> str:
    """What JSON calls ``value`` (``array``, ``string`` ...): messages about a file's JSON speak
    JSON, not Python (``list``, ``str``)."""
    if value is None:
        return "null"
    return _JSON_KINDS.get(type(value).__name__, "value")
