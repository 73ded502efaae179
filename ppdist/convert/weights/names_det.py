"""Paddle names of the det stages that differ from ppdist's (see ``naming``).

PaddleDetection's ``YOLOv3`` architecture calls the PP-YOLOE head ``yolo_head``; CSPResNet
names its stem layers ``conv1``, ``conv2`` (, ``conv3`` with ``use_large_stem``) where ppdist's
``stem`` is an indexed ``Sequential``. Everything else (``stages.N.{conv_down, conv1, conv2,
blocks.M.{conv1, conv2.{conv1, conv2, alpha}}, attn.fc, conv3}``, the neck's ``fpn_stages`` /
``fpn_routes`` / ``pan_stages`` / ``pan_routes`` with ``convs.{N, spp}``, the head's
``stem_cls`` / ``stem_reg`` / ``pred_cls`` / ``pred_reg``) keeps PaddleDetection's names, and
BatchNorm statistics follow the per-layer rule. The head's frozen DFL projection
``proj_conv.weight`` (0..reg_max) is a constant in ppdist (``PPYOLOEHead.proj``), checked on
conversion. tests/convert/test_det_equivalence.py checks this against PaddleDetection's model.
"""

from ppdist.convert.weights.naming import register_constants, register_renames

register_renames(
    "CSPResNet",
    [
        (r"^backbone\.stem\.0\.", "backbone.stem.conv1."),
        (r"^backbone\.stem\.1\.", "backbone.stem.conv2."),
        (r"^backbone\.stem\.2\.", "backbone.stem.conv3."),
    ],
)
register_renames("PPYOLOEHead", [(r"^head\.", "yolo_head.")])
register_constants("PPYOLOEHead", [("proj_conv.weight", "proj")])
