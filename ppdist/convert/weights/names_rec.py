"""Paddle names of the rec stages that differ from ppdist's (see ``naming``).

None do: ppdist's CRNN stages (``MobileNetV3``, ``SequenceEncoder``, ``CTCHead``) keep
PaddleOCR's attribute names (``backbone.conv1``, ``backbone.blocks.N.{expand_conv,
bottleneck_conv,mid_se,linear_conv}``, ``backbone.conv2``, ``neck.encoder.lstm``,
``head.fc``), so only the per-layer rules apply: BatchNorm ``_mean`` / ``_variance``, the LSTM's
flat (``weight_ih_l0_reverse``) or per-cell (``0.cell_bw.weight_ih``) names, and the transposed
Linear weight. tests/convert/test_rec_equivalence.py checks this against PaddleOCR's own model.
"""
