"""Byte-level input/output: safetensors headers, byte sources, shard sets."""
