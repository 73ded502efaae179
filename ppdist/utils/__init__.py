"""Small utilities with one home each: atomic file writes (``atomic``) and RNG streams (``rng``)."""
