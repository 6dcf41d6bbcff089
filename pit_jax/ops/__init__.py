"""Functional ops: semantics, validation, custom VJPs and the reference fallback."""
