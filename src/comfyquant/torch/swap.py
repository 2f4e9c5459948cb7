"""What putting a ``QuantLinear`` in an ``nn.Linear``'s place may lose, and what it carries over.

A load replaces the module object, so everything the old module holds goes with it unless it
is moved.  The rule (``docs/pytorch.md``):

* **refused** -- tensors and modules the model holds in the layer besides its weight and bias:
  an extra parameter or buffer (a gate, an FP8 ``weight_scale`` of the model's own), a
  submodule (LoRA branches, ``parametrizations``), a tensor kept as a plain attribute, extra
  state (``get_extra_state``), a ``forward`` set on the instance.  A ``QuantLinear`` has no
  place for them and its forward would not use them, so keeping them would still change what
  the model computes; the load is refused in one line naming the layer and the attribute.
* **carried over** -- the module's hooks (forward, backward, state-dict; the very dicts, so
  every handle still removes its hook) and its training mode.  The report lists the hooks.
* **replaced** -- the class: the layer computes ``QuantLinear``'s forward (the purpose of the
  load), and Python attributes that hold no tensor go with the old object.
"""

from __future__ import annotations

import torch
from torch import nn

from .linear import QuantLinear

_MODULE_ATTRIBUTES = frozenset(vars(nn.Linear(1, 1, device="meta")))
"""What every ``nn.Linear`` instance holds (bookkeeping dicts, features, training)."""

_QUANT_ATTRIBUTES = frozenset({"marker", "name", "suffixes", "_qt", "bias"})
"""What a ``QuantLinear`` instance holds besides ``_MODULE_ATTRIBUTES``."""

_HOOK_WORDS = {
    "_forward_pre_hooks": "forward pre-hook",
    "_forward_hooks": "forward hook",
    "_backward_pre_hooks": "backward pre-hook",
    "_backward_hooks": "backward hook",
    "_state_dict_pre_hooks": "state_dict pre-hook",
    "_state_dict_hooks": "state_dict hook",
    "_load_state_dict_pre_hooks": "load_state_dict pre-hook",
    "_load_state_dict_post_hooks": "load_state_dict post-hook",
}
"""The hook dicts of ``nn.Module`` and how the report names one hook of each."""

_HOOK_STATE = tuple(name for name in sorted(_MODULE_ATTRIBUTES) if "hook" in name)
"""Every per-module hook attribute (the dicts above plus their flags: ``with_kwargs``,
``always_called``, ``_is_full_backward_hook``): moved together so the hooks run as registered."""


def lost_state(module: nn.Module) -> str | None:
    """What of ``module`` a swap would drop, in words (``parameter 'gate'``); None: nothing
    but its weight, bias (or a ``QuantLinear``'s stored tensors) and hooks."""
    quant = isinstance(module, QuantLinear)
    own_buffers = set(module.suffixes) if isinstance(module, QuantLinear) else set()
    for name, _p in module.named_parameters(recurse=False):
        if name not in ("weight", "bias"):
            return f"parameter {name!r}"
    for name, _b in module.named_buffers(recurse=False):
        if name not in own_buffers:
            return f"buffer {name!r}"
    for name, _m in module.named_children():
        return f"submodule {name!r}"
    known = _MODULE_ATTRIBUTES | (_QUANT_ATTRIBUTES if quant else frozenset())
    for name, value in vars(module).items():
        if name not in known and isinstance(value, (torch.Tensor, nn.Module)):
            return f"tensor attribute {name!r}"
    if "forward" in vars(module):
        return "a forward set on the instance"
    if type(module).get_extra_state is not nn.Module.get_extra_state:
        return f"extra state ({type(module).__name__}.get_extra_state)"
    return None


def carry_over(old: nn.Module, new: nn.Module) -> list[str]:
    """Give ``new`` the hooks and training mode of ``old``; the hooks moved, counted by kind
    (``["2 forward hooks"]``).  ``old`` is only read: a load that fails later leaves it whole."""
    held, moved = vars(old), []
    for name, word in _HOOK_WORDS.items():
        count = len(held[name])
        if count:
            moved.append(f"{count} {word}{'s' * (count > 1)}")
    if moved:
        for name in _HOOK_STATE:
            vars(new)[name] = held[name]
    new.training = old.training
    return moved
