"""One module per CLI command: ``add_parser(subparsers)`` and ``run(args) -> exit code``.

``COMMANDS`` lists the module names in the order ``--help`` shows them; a module is imported
only when its command runs (start-up time), except for building the parser.
"""

COMMANDS = ("check", "inspect", "fix", "migrate", "dequantize", "quantize", "convert", "compare", "recipe", "comfyui")
