"""Bring Paddle artefacts to ppdist: weights (``weights``: ``.pdparams`` read without Paddle and
converted per model) and PaddleDetection / PaddleSeg / PaddleOCR configs (``configs``: converted to
ppdist's schema). Depends on the config package and the models, never the reverse."""
