"""PaddleDetection's per-sample ``RandomResize`` (two-stage detectors' training reader).

Each sample draws its own target size from ``target_size`` (a list of [h, w] pairs or ints) and,
with ``random_interp``, its own interpolation; the resize itself is ``Resize``'s
(``resize_detection``): with ``keep_ratio`` the short side goes to min(target) unless the long side
would pass max(target). Images of one batch therefore differ in size (``PadBatch`` joins them).
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple, Union

import numpy as np

from ppdist.data.transforms.det import BATCH_INTERPS, Sample, cv_interp, hw_size, resize_detection
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS


@TRANSFORMS.register
class RandomResize:
    """Resize one sample to a size drawn from ``target_size`` (``random_size``), or the range
    [[min_short, long], [max_short, long]] (``random_range``: short side uniform in
    [min_short, max_short], long side PaddleDetection's ``max(long_0, long_1 + 1)``); interpolation
    drawn from nearest/linear/area/cubic/lanczos4 with ``random_interp``, else ``interp``."""

    def __init__(
        self,
        target_size: Union[int, Sequence[Any]],
        keep_ratio: bool = True,
        interp: Union[int, str] = 1,
        random_range: bool = False,
        random_size: bool = True,
        random_interp: bool = False,
    ) -> None:
        where = "RandomResize.target_size"
        if (random_range or random_size) and (not isinstance(target_size, (list, tuple)) or not target_size):
            raise ConfigError(
                f"{where} must be a non-empty list of sizes when random_size or random_range is true, "
                f"got {target_size!r}"
            )
        if random_range:
            if len(target_size) != 2:
                raise ConfigError(
                    f"{where} must be [[min_short, long], [max_short, long]] with random_range, got {target_size!r}"
                )
            low, high = (hw_size(s, f"{where}[]") for s in target_size)
            if low[0] > high[0]:
                raise ConfigError(f"{where}: min_short {low[0]} is above max_short {high[0]}")
            self.range = (low[0], high[0], max(low[1], high[1] + 1))
            self.sizes = []
        elif random_size:
            self.sizes = [hw_size(s, f"{where}[]") for s in target_size]
        else:
            self.sizes = [hw_size(target_size, where)]
        self.random_range = bool(random_range)
        self.keep_ratio = bool(keep_ratio)
        self.interp = cv_interp(interp, "RandomResize.interp")
        self.random_interp = bool(random_interp)

    def draw(self) -> Tuple[Tuple[int, int], int]:
        """The (h, w) target and cv2 interpolation for one sample."""
        if self.random_range:
            short_low, short_high, long_edge = self.range
            size = (int(np.random.randint(short_low, short_high + 1)), long_edge)
        else:
            size = self.sizes[int(np.random.randint(len(self.sizes)))]
        interp = (
            BATCH_INTERPS[int(np.random.randint(len(BATCH_INTERPS)))] if self.random_interp else self.interp
        )
        return size, interp

    def __call__(self, data: Sample) -> Sample:
        size, interp = self.draw()
        return resize_detection(data, size, self.keep_ratio, interp)
