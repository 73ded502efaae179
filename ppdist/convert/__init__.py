"""Bring Paddle artefacts to ppdist: ``.pdparams`` weights read without Paddle (``pdparams``) and
converted per model (``naming``, ``names_*``, ``weights``); PaddleDetection / PaddleSeg / PaddleOCR
configs converted to ppdist's schema (``configs``)."""
