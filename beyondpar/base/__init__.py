"""Helpers every layer uses: argument checks, files, devices, memory, locks,
settings, timing.

Nothing here imports the rest of beyondpar.
"""
