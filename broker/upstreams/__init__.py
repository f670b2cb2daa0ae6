"""Upstream groups balanced exactly as nginx balances them (issue 30), pure: the spec and
its validation (spec.py) and nginx's hash functions (hashing.py).
"""
from .spec import BALANCES, ServerSpec, SpecError, UpstreamSpec, validate

__all__ = ["BALANCES", "ServerSpec", "SpecError", "UpstreamSpec", "validate"]
