"""Kimi K2.6 + DFlash serving recipe for 8x MI300X, with a CPU reference deployment."""

__version__ = "0.1.0"
