"""OCRNet's head (PaddleSeg semantics): object-contextual representations.

From the backbone's feature list, ``backbone_indices`` picks one map (used twice) or two (the
first for the auxiliary head, the second for the pixels). The auxiliary head predicts soft object
regions; a 3x3 ConvBNReLU gives the pixel representation; each region's representation is the
softmax(region)-weighted mean of the pixels (spatial gather); each pixel attends to the regions
(object attention: query/key/value projections, scaled dot product); its context, concatenated
with the pixel, is fused by a 1x1 ConvBNReLU (+ Dropout2d 0.1) and classified by a 1x1 conv.
Output: logits upsampled (bilinear) to the input size — in training ``[main, soft regions]``,
in eval ``[main]`` (PaddleSeg's contract).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.layers import ConvBNAct
from ppdist.modeling.paddle_names import PaddleNames
from ppdist.ops.resize import upsample_logits
from ppdist.registry import HEADS


def _conv1x1(in_channels: int, out_channels: int) -> ConvBNAct:
    """PaddleSeg's ``ConvBNReLU(in, out, 1)`` (the conv keeps Paddle's default bias)."""
    return ConvBNAct(in_channels, out_channels, 1, bias=True)


def spatial_gather(pixels: torch.Tensor, regions: torch.Tensor) -> torch.Tensor:
    """``[N, C, K, 1]``: for each of the K regions, the pixels averaged with its softmax over
    the positions as weights (``pixels`` ``[N, C, H, W]``, ``regions`` ``[N, K, H, W]``)."""
    weights = F.softmax(regions.flatten(2), dim=2)  # N, K, HW
    objects = torch.bmm(weights, pixels.flatten(2).transpose(1, 2))  # N, K, C
    return objects.transpose(1, 2).unsqueeze(-1)


class ObjectAttentionBlock(nn.Module):
    """Pixels (query) attend to the object representations (keys, values), in ``key_channels``."""

    def __init__(self, in_channels: int, key_channels: int) -> None:
        super().__init__()
        self.key_channels = key_channels
        self.f_pixel = nn.Sequential(
            _conv1x1(in_channels, key_channels), _conv1x1(key_channels, key_channels)
        )
        self.f_object = nn.Sequential(
            _conv1x1(in_channels, key_channels), _conv1x1(key_channels, key_channels)
        )
        self.f_down = _conv1x1(in_channels, key_channels)
        self.f_up = _conv1x1(key_channels, in_channels)

    def forward(self, x: torch.Tensor, proxy: torch.Tensor) -> torch.Tensor:
        query = self.f_pixel(x).flatten(2).transpose(1, 2)  # N, HW, Ck
        key = self.f_object(proxy).flatten(2)  # N, Ck, K
        value = self.f_down(proxy).flatten(2).transpose(1, 2)  # N, K, Ck
        similarity = F.softmax(torch.bmm(query, key) * self.key_channels**-0.5, dim=-1)
        context = torch.bmm(similarity, value).transpose(1, 2)  # N, Ck, HW
        return self.f_up(context.reshape(context.shape[0], self.key_channels, x.shape[2], x.shape[3]))


class SpatialOCRModule(nn.Module):
    """concat(object context, pixels) -> 1x1 ConvBNReLU -> Dropout2d."""

    def __init__(self, in_channels: int, key_channels: int, out_channels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.attention_block = ObjectAttentionBlock(in_channels, key_channels)
        self.conv1x1 = nn.Sequential(_conv1x1(2 * in_channels, out_channels), nn.Dropout2d(dropout))

    def forward(self, pixels: torch.Tensor, objects: torch.Tensor) -> torch.Tensor:
        context = self.attention_block(pixels, objects)
        return self.conv1x1(torch.cat([context, pixels], dim=1))


@HEADS.register
class OCRHead(nn.Module):
    """Everything of PaddleSeg's ``OCRNet`` after the backbone (its ``head`` and the upsampling)."""

    # PaddleSeg's ``OCRNet.head`` holds the same children; its ConvBNReLUs name their layers ``_conv`` and
    # ``_batch_norm`` where ppdist's ``ConvBNAct`` has ``conv`` and ``bn``; ``cls_head`` and ``aux_head.1``
    # are bare convs in both. tests/convert/test_ocrnet_equivalence.py checks this.
    paddle_names = PaddleNames(
        renames=(
            (r"^(.+)\.conv\.(weight|bias)$", r"\1._conv.\2"),
            (r"^(.+)\.bn\.(\w+)$", r"\1._batch_norm.\2"),
        )
    )

    def __init__(
        self,
        in_channels: Sequence[int],
        num_classes: int,
        backbone_indices: Sequence[int],
        ocr_mid_channels: int = 512,
        ocr_key_channels: int = 256,
        align_corners: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(in_channels, (list, tuple)):
            raise ValueError("OCRHead needs a backbone that returns a list of feature maps")
        indices = list(backbone_indices) if isinstance(backbone_indices, (list, tuple)) else []
        if len(indices) not in (1, 2) or not all(
            isinstance(i, int) and -len(in_channels) <= i < len(in_channels) for i in indices
        ):
            raise ValueError(
                f"backbone_indices must hold 1 or 2 indices into the backbone's {len(in_channels)} "
                f"feature maps, got {backbone_indices!r}"
            )
        if num_classes is None or num_classes <= 0:
            raise ValueError("num_classes must be a positive integer (set Global.num_classes)")
        self.backbone_indices = indices
        self.align_corners = align_corners
        shallow, deep = in_channels[indices[0]], in_channels[indices[-1]]  # one index: used for both
        self.conv3x3_ocr = ConvBNAct(deep, ocr_mid_channels, 3, bias=True)
        self.spatial_ocr = SpatialOCRModule(ocr_mid_channels, ocr_key_channels, ocr_mid_channels)
        self.cls_head = nn.Conv2d(ocr_mid_channels, num_classes, 1)
        self.aux_head = nn.Sequential(_conv1x1(shallow, shallow), nn.Conv2d(shallow, num_classes, 1))
        self.out_channels = num_classes
        self._init_weights()

    def _init_weights(self) -> None:
        """PaddleSeg's OCRHead init: conv weights Normal(0, 0.001) (biases 0), BN 1/0."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.001)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(
        self, feats: Sequence[torch.Tensor], input_size: Optional[Sequence[int]] = None
    ) -> List[torch.Tensor]:
        shallow, deep = feats[self.backbone_indices[0]], feats[self.backbone_indices[-1]]
        soft_regions = self.aux_head(shallow)
        pixels = self.conv3x3_ocr(deep)
        ocr = self.spatial_ocr(pixels, spatial_gather(pixels, soft_regions))
        logits = [self.cls_head(ocr), soft_regions] if self.training else [self.cls_head(ocr)]
        size = list(input_size) if input_size is not None else [s * 4 for s in deep.shape[2:]]
        return [upsample_logits(x, size, self.align_corners) for x in logits]
