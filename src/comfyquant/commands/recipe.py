"""``comfyquant recipe GOOD``: the rules file that reproduces a quantized checkpoint's choices.

Header reads only (no torch): per layer the format and parameters its marker and tensors
say, dense linear layers as ``keep``, grouped into as few globs as stay exact.  The text is a
rules file ``quantize --rules`` reads; ``quantize --like GOOD`` applies it directly.
"""

from __future__ import annotations

import json
import sys

from .streams import say

HELP = "print the rules file that reproduces a quantized checkpoint's per-layer formats (quantize --like applies it)"


def add_parser(sub) -> None:
    p = sub.add_parser("recipe", help=HELP, description=HELP)
    p.add_argument("inputs", nargs="+", metavar="GOOD", help="quantized checkpoint: file(s), folder or *.safetensors.index.json")
    p.add_argument("--json", action="store_true", help="print the rules and every layer's choice as JSON")


def run(args) -> int:
    from ..quantizer.recipe import read_recipe

    recipe = read_recipe(args.inputs[0] if len(args.inputs) == 1 else args.inputs)
    if args.json:
        print(json.dumps(recipe.to_dict(), indent=1))
    else:
        sys.stdout.write(recipe.toml())
    for c in recipe.unreproducible:
        say(f"warning: {c.name}: cannot be reproduced by quantize: {c.why} (the recipe keeps it dense)")
    return 1 if recipe.unreproducible else 0
