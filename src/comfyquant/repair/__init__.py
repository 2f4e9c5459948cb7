"""Repairs: plan lossless (and, when allowed, lossy) fixes from the format descriptions and
apply them with a streaming, verified, atomic rewrite."""
