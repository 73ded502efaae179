"""Paddle names of the seg stages that differ from ppdist's (see ``naming``).

PaddleSeg's ``PPLiteSeg`` keeps the backbone as ``backbone``, the context module and the
decoder as ``ppseg_head`` (``cm``, ``arm_list``) and the three segmentation heads beside it as
``seg_heads``; ppdist's ``PPLiteSegHead`` holds all of them, so ``head.seg_heads.*`` is
``seg_heads.*`` and the rest of ``head.*`` is ``ppseg_head.*``. PaddleSeg's decoder blocks
(``layers.ConvBNReLU`` / ``ConvBN``) name their layers ``_conv`` and ``_batch_norm`` where
ppdist's ``ConvBNAct`` has ``conv`` and ``bn``; a seg head's 1x1 classifier (``conv_out``) is a
bare conv in both.

The STDC backbones need no renames: PaddleSeg's ``STDCNet`` uses ``features.<i>`` with
``conv`` / ``bn`` (``ConvBNRelu``), ``conv_list`` and ``avd_layer``, as ppdist does. ImageNet
STDC files hold the same names without the ``backbone.`` prefix (``stage="backbone"``).
"""

from ppdist.convert.weights.naming import register_renames

register_renames(
    "PPLiteSegHead",
    [
        # (every key of the model goes through every stage's renames: anchor them on the stage)
        (r"^(head\..*)\.conv\.(weight|bias)$", r"\1._conv.\2"),  # ConvBNAct.conv -> ConvBNReLU._conv
        (r"^(head\..*)\.bn\.(\w+)$", r"\1._batch_norm.\2"),  # ConvBNAct.bn -> ConvBNReLU._batch_norm
        (r"^head\.seg_heads\.", "seg_heads."),
        (r"^head\.", "ppseg_head."),
    ],
)
