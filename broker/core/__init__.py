"""The broker's state core: pure, no I/O, the clock a parameter (broker.py says how)."""
