"""Turns across processes (aiolock/_waiting/turns.py), on real servers."""
