"""Numeric building blocks shared by every codec (comfy-kitchen 0.2.40 ``float_utils.py`` and
its eager backend).

Each module reproduces comfy-kitchen 0.2.40's reference arithmetic (its CPU eager backend)
so that codecs built on them are bit-exact with it:

* ``dtypes``   safetensors dtype strings <-> torch dtypes, tensors from raw bytes;
* ``floats``   FP8 E4M3/E5M2, FP4 E2M1, E8M0 and BF16/F16 encode and decode;
* ``packing``  nibble packing (low or high nibble first) and the 6-bit high-bit plane;
* ``blocked``  the blocked ("swizzled") 128x4 scale layout and its inverse, with padding;
* ``hadamard`` the ConvRot regular Hadamard rotation for every power of 4;
* ``int8``     dynamic row-wise INT8 activation quantization and the INT8 GEMM epilogue;
* ``rows``     row blocking (encode, decode, forward, quality report) and row sources.

These modules import torch at the top (except ``blocked``, which ``fix`` also uses on
numpy arrays): they are only imported by the codecs, which the light commands (``check``,
``inspect``) never load.
"""
