"""Held-out failure states for recovery evaluation (see build_states.py)."""
