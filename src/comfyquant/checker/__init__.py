"""Checking: findings, the per-layer checker and the runtime target profiles."""
