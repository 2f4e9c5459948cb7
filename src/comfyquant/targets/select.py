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


def split_target(text: str) -> tuple[str, tuple[str, str] | None]:
    """``"comfyui>=0.27"`` -> ``("comfyui", (">=", "0.27"))``: a runtime name with an optional
    release spec (ComfyUI's releases only; a bare name has none)."""
    if not any(op in text for op in "=<>"):
        return text, None
    from .comfyui_releases import selected_releases, split_release

    name, spec = split_release(text)
    if name == "comfy-kitchen":
        from .kitchen_releases import selected_releases as kitchen_selected

        kitchen_selected(spec)
        return name, spec
    if name != "comfyui":
        raise ValueError(f"target {text!r}: releases are modelled for ComfyUI only (e.g. comfyui==0.31.0)")
    selected_releases(spec)
    return name, spec


def _specs(target) -> dict[str, tuple[str, str]]:
    specs = {}
    for item in [target] if isinstance(target, str) else list(target or ()):
        for part in str(item).split(","):
            name, found = split_target(part.strip())
            if found is not None:
                specs[name] = found
    return specs


def with_releases(verdicts: dict, target, ckpt, selected=("comfyui",)) -> None:
    """Give the ComfyUI and comfy-kitchen verdicts (of the ``selected`` runtimes) their
    per-release verdicts: every release (or those ``target`` selects with a spec such as
    ``comfyui>=0.27``), and, for a spec, the newest selected release's verdict in its place."""
    specs = _specs(target)
    if "comfyui" in verdicts and "comfyui" in selected:
        from .comfyui_releases import released, releases_for

        verdicts["comfyui"] = released(verdicts["comfyui"], releases_for(ckpt, verdicts["comfyui"], specs.get("comfyui")))
    if "comfy-kitchen" in verdicts and "comfy-kitchen" in selected:
        from . import kitchen_releases

        newest = verdicts["comfy-kitchen"]
        found = kitchen_releases.releases_for(ckpt, newest, specs.get("comfy-kitchen"))
        verdicts["comfy-kitchen"] = kitchen_releases.released(newest, found)
