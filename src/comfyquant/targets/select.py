"""The runtime profiles by name: the one place that knows all three (each profile knows only itself
and the shared pieces in ``base``/``container``; ComfyUI's also reads comfy-kitchen's kernels)."""

from __future__ import annotations

from .base import Verdict

TARGETS = ("sglang", "comfyui", "comfy-kitchen")


def run_target(name: str, ckpt) -> Verdict:
    """The verdict of runtime ``name`` on ``ckpt`` (profiles import lazily: a check selects few)."""
    if name == "sglang":
        from .sglang import sglang_verdict

        return sglang_verdict(ckpt)
    if name == "comfyui":
        from .comfyui import comfyui_verdict

        return comfyui_verdict(ckpt)
    if name == "comfy-kitchen":
        from .kitchen import kitchen_verdict

        return kitchen_verdict(ckpt)
    raise ValueError(f"unknown target {name!r}: choose from {', '.join(TARGETS)}")


RELEASED = {
    "comfyui": ("ComfyUI", "comfyui==0.31.0"),
    "sglang": ("SGLang", "sglang==0.5.21"),
    "comfy-kitchen": ("comfy-kitchen", "comfy-kitchen==0.2.31"),
}
"""The runtimes whose releases are modelled: name -> (its name in words, a spec's example)."""


def release_model(name: str):
    """The module that models runtime ``name``'s releases (each has ``selected_releases``,
    ``releases_for`` and ``released``); None when only its proven release is modelled."""
    if name == "comfyui":
        from . import comfyui_releases

        return comfyui_releases
    if name == "sglang":
        from . import sglang_releases

        return sglang_releases
    if name == "comfy-kitchen":
        from . import kitchen_releases

        return kitchen_releases
    return None


def split_target(text: str) -> tuple[str, tuple[str, str] | None]:
    """``"comfyui>=0.27"`` -> ``("comfyui", (">=", "0.27"))``: a runtime name with an optional
    release spec (a runtime of ``RELEASED`` only; a bare name has none)."""
    if not any(op in text for op in "=<>"):
        return text, None
    from .releases import split_release

    name, spec = split_release(text, {n: e for n, (_, e) in RELEASED.items()})
    model = release_model(name)
    if model is None:
        named = [w for w, _ in RELEASED.values()]
        words = f"{', '.join(named[:-1])} and {named[-1]}"
        examples = ", ".join(e for _, e in RELEASED.values())
        raise ValueError(f"target {text!r}: releases are modelled for {words} only (e.g. {examples})")
    model.selected_releases(spec)
    return name, spec


def target_specs(target) -> dict[str, tuple[str, str]]:
    """The release spec ``target`` gives each runtime (``comfyui>=0.27`` -> ``(">=", "0.27")``)."""
    specs: dict[str, tuple[str, str]] = {}
    for item in [target] if isinstance(target, str) else list(target or ()):
        for part in str(item).split(","):
            name, found = split_target(part.strip())
            if found is not None:
                specs[name] = found
    return specs


def four_bit_w4a8(target, selected: tuple[str, ...]) -> tuple[str, ...]:
    """The selected runtimes whose judged release (the newest ``target`` selects) reads every
    W4A8 row as 4-bit codes, named as a plan line names them: SGLang (every release), ComfyUI
    with the comfy-kitchen it pins (every release so far), comfy-kitchen before 0.2.36."""
    from . import comfyui_releases, kitchen_releases

    specs = target_specs(target)
    out = []
    for name in selected:
        if name == "sglang":
            out.append("SGLang")
        elif name == "comfyui":
            release = comfyui_releases.selected_releases(specs.get(name))[-1]
            pin = comfyui_releases.group_of(release).kitchen
            if pin is not None and not kitchen_releases.group_of(pin).six_bit:
                out.append(f"ComfyUI {release} with comfy-kitchen {pin}")
        elif name == "comfy-kitchen":
            release = kitchen_releases.selected_releases(specs.get(name))[-1]
            if not kitchen_releases.group_of(release).six_bit:
                out.append(f"comfy-kitchen {release}")
    return tuple(out)


def with_releases(verdicts: dict, target, ckpt, selected) -> None:
    """Give each selected runtime whose releases are modelled its per-release verdicts: every
    release (or those ``target`` selects with a spec such as ``comfyui>=0.27`` or
    ``sglang==0.5.21``), and, for a spec, the newest selected release's verdict in its place."""
    specs = target_specs(target)
    for name in selected:
        model = release_model(name)
        if model is not None and name in verdicts:
            verdicts[name] = model.released(verdicts[name], model.releases_for(ckpt, verdicts[name], specs.get(name)))
