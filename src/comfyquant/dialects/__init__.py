"""Foreign layouts of quantized weights ("dialects"): one package each, read by every command.

See :mod:`.base` for the vocabulary and :mod:`.registry` for detection.
"""
