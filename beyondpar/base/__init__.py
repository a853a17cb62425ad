"""Helpers every layer uses: argument checks, files, devices, locks, settings, timing.

Nothing here imports the rest of beyondpar.
"""
