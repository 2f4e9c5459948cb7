"""Foreign layouts of quantized weights ("dialects"): one package each, read by every command.

See ``base`` for the vocabulary and ``registry`` for detection.
"""
