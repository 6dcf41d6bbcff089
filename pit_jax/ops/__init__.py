"""Functional ops: semantics, validation and the reference fallback."""
