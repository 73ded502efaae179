"""Semantic-segmentation datasets: PaddleSeg file lists (SegDataSet) and Cityscapes layout.

Both read the image with cv2 (RGB uint8) and the label with PIL as the raw array (palette
indices kept), check them, and after the transforms return exactly
``{"image": float32 [C, H, W], "label": int64 [H, W]}``. In train mode the label is in
``gt_fields`` (transformed with the image); in eval mode it stays at full resolution.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import cv2
import numpy as np
from PIL import Image

from ppdist.data.base import BaseDataSet, inside_root
from ppdist.data.image_size import DEFAULT_MAX_IMAGE_PIXELS, check_image_pixels
from ppdist.errors import ConfigError, DataError, DataPathError
from ppdist.registry import DATASETS

LABELS_FILE = "labels.txt"  # dataset_root/labels.txt: one class name per line, class 0 first
CITYSCAPES_NAMES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train",
    "motorcycle", "bicycle",
)  # fmt: skip


def read_class_names(dataset_root: str, num_classes: int) -> List[str]:
    """The class names of ``dataset_root/labels.txt`` (one per line, as ppdist's synthetic sets
    write it), or ``[]`` when there is none or it does not hold ``num_classes`` names."""
    path = os.path.join(dataset_root, LABELS_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            names = [line.strip() for line in handle if line.strip()]
    except (OSError, UnicodeDecodeError):
        return []
    return names if len(names) == num_classes else []


def _section(mode: str) -> str:
    return "Train.dataset" if mode == "train" else "Eval.dataset"


class _Item(NamedTuple):
    image: str  # absolute or dataset_root-joined path ("" when the entry is malformed)
    label: str  # label path, or what is wrong with a malformed line
    origin: str  # where the entry came from, for messages
    ok: bool


def _label_values(label: np.ndarray) -> np.ndarray:
    """The distinct values of ``label`` (for uint8 a histogram: much faster than np.unique)."""
    if label.dtype == np.uint8 and label.ndim == 2:
        return np.flatnonzero(cv2.calcHist([label], [0], None, [256], [0, 256]).ravel())
    return np.unique(label)


class _SegBase(BaseDataSet):
    """Reading, checking and output layout shared by the segmentation datasets."""

    def __init__(
        self,
        transforms: list,
        mode: str,
        num_classes: Optional[int],
        ignore_index: int,
        img_channels: int = 3,
    ) -> None:
        super().__init__(transforms, mode)
        sec = _section(mode)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes <= 0:
            raise ConfigError(
                f"{sec}.num_classes must be a positive int (the number of classes), got {num_classes!r}"
            )
        if img_channels not in (1, 3):
            raise ConfigError(f"{sec}.img_channels must be 1 or 3, got {img_channels!r}")
        self.num_classes: int = num_classes
        self.label_list: List[str] = []  # class names, when the dataset has them
        self.ignore_index = int(ignore_index)
        self.img_channels = img_channels
        self.items: List[_Item] = []
        self.root = "/"  # the folder the items' paths must stay in (a subclass narrows it)
        self.max_image_pixels: Optional[int] = DEFAULT_MAX_IMAGE_PIXELS
        self.allow_paths_outside_root = True
        self.layout_on_device = False  # see leave_layout_to_device

    def __len__(self) -> int:
        return len(self.items)

    def origin(self, index: int) -> str:
        return self.items[index].origin

    def image_file(self, index: int) -> str:
        """The path of sample ``index``'s image file."""
        return self.items[index].image

    def read(self, index: int) -> Dict[str, Any]:
        item = self.items[index]
        if not item.ok:
            raise DataError(f"{item.origin}: malformed line: {item.label}")
        for path in (item.image, item.label):
            inside_root(self.root, path, self.allow_paths_outside_root, "allow_paths_outside_root")
        flag = cv2.IMREAD_COLOR if self.img_channels == 3 else cv2.IMREAD_GRAYSCALE
        check_image_pixels(item.image, self.max_image_pixels)
        image = cv2.imread(item.image, flag)
        if image is None:
            raise DataError(f"cannot read image {item.image} (missing or not an image)")
        if image.ndim == 3:
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        try:
            with Image.open(item.label) as handle:
                label = np.asarray(handle)
        except Exception as exc:
            raise DataError(f"cannot read label {item.label}: {type(exc).__name__}: {exc}") from exc
        self.check(image, label, item)
        return {"image": image, "label": label, "gt_fields": ["label"] if self.mode == "train" else []}

    def check(self, image: np.ndarray, label: np.ndarray, item: _Item) -> None:
        """Raise DataError when the label cannot go with the image."""
        if label.ndim != 2:
            raise DataError(
                f"label {item.label} has shape {label.shape}; expected a single-channel "
                "(L or P mode) image of class ids"
            )
        if label.shape != image.shape[:2]:
            raise DataError(
                f"label {item.label} is {label.shape[1]}x{label.shape[0]} but image "
                f"{item.image} is {image.shape[1]}x{image.shape[0]} (WxH)"
            )
        values = _label_values(label)
        bad = values[((values < 0) | (values >= self.num_classes)) & (values != self.ignore_index)]
        if bad.size:
            raise DataError(
                f"label {item.label} has value(s) {bad[:10].tolist()} outside "
                f"[0, {self.num_classes}) and not ignore_index {self.ignore_index}"
            )

    layout_change_in_finish = True

    def leave_layout_to_device(self) -> Dict[str, str]:
        self.layout_on_device = True
        return {"label": "int64"}

    def image_hw(self, data: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
        """The finished image's (height, width): [H, W, C] while the device makes the layout."""
        image = np.asarray(data["image"])
        return (int(image.shape[0]), int(image.shape[1])) if self.layout_on_device else super().image_hw(data)

    def finish(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """``image`` float32 [C, H, W] and ``label`` int64 [H, W]; nothing else. When the loader
        leaves the layout to the device: the image [H, W, C] and the label as the transforms made
        them (e.g. uint8; the device makes them float32 CHW and int64)."""
        image = np.asarray(data["image"])
        if self.layout_on_device:
            out = {"image": np.ascontiguousarray(image[:, :, None] if image.ndim == 2 else image)}
        else:
            image = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
            out = {"image": np.ascontiguousarray(image, dtype=np.float32)}
        if "label" in data:
            label = np.asarray(data["label"])
            if label.ndim == 3 and label.shape[0] == 1:
                label = label[0]
            dtype = label.dtype if self.layout_on_device and label.dtype.kind in "iu" else np.int64
            out["label"] = np.require(label, dtype, ["C", "W"])  # PIL's arrays are read-only
        return out


def _resolve_list(path: str, root: str, key: str) -> str:
    """A file list path: absolute, relative to ``root`` or to the working directory."""
    if os.path.isabs(path):
        candidates = [path]
    else:
        candidates = [os.path.join(root, path), path]
    for cand in candidates:
        if os.path.isfile(cand):
            return cand
    raise DataPathError(f"{key}: file list not found: {' or '.join(candidates)}")


@DATASETS.register
class SegDataSet(_SegBase):
    """PaddleSeg's generic file-list dataset: lines ``image_path<separator>label_path``.

    Paths are relative to ``dataset_root``; one that resolves outside it (``../``, an absolute
    path elsewhere) is a bad sample, not read, unless ``allow_paths_outside_root: true``. Train mode
    reads ``train_path``, eval mode ``val_path``. Malformed lines are kept and reported when read.
    """

    def __init__(
        self,
        dataset_root: str,
        transforms: list,
        mode: str = "train",
        seed: int = 1024,
        num_classes: Optional[int] = None,
        train_path: Optional[str] = None,
        val_path: Optional[str] = None,
        ignore_index: int = 255,
        separator: str = " ",
        img_channels: int = 3,
        allow_paths_outside_root: bool = False,
        max_image_pixels: Optional[int] = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        super().__init__(transforms, mode, num_classes, ignore_index, img_channels)
        sec = _section(mode)
        self.allow_paths_outside_root = bool(allow_paths_outside_root)
        self.max_image_pixels = max_image_pixels
        if not separator:
            raise ConfigError(f"{sec}.separator must not be empty")
        if not os.path.isdir(dataset_root):
            raise DataPathError(f"{sec}.dataset_root: directory not found: {dataset_root}")
        key, path = (f"{sec}.train_path", train_path) if mode == "train" else (f"{sec}.val_path", val_path)
        if not path:
            raise ConfigError(f"{key} is required: the file list of 'image label' lines for this dataset")
        self.dataset_root = self.root = dataset_root
        self.seed = seed
        self.separator = separator
        self.file_list = _resolve_list(path, dataset_root, key)
        self.items = self._parse(self.file_list)
        self.label_list = read_class_names(dataset_root, self.num_classes)

    def _parse(self, path: str) -> List[_Item]:
        items: List[_Item] = []
        with open(path, "rb") as handle:
            for line_no, raw in enumerate(handle, start=1):
                where = f"{path}:{line_no}"
                try:
                    text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8").strip()
                except UnicodeDecodeError as exc:
                    items.append(_Item("", f"not valid UTF-8 ({exc.reason})", where, False))
                    continue
                if not text:
                    continue
                parts = text.split(self.separator)
                if len(parts) != 2 or not parts[0] or not parts[1]:
                    why = (
                        f"expected 'image_path{{separator}}label_path' with separator {self.separator!r}, "
                        f"got {text[:80]!r}"
                    )
                    items.append(_Item("", why, where, False))
                    continue
                img, lbl = (os.path.join(self.dataset_root, p) for p in parts)
                items.append(_Item(img, lbl, f"{where} ({parts[0]})", True))
        return items


@DATASETS.register
class CityscapesDataSet(_SegBase):
    """Cityscapes found by sorted glob: ``leftImg8bit/<split>/*/*_leftImg8bit.png`` with
    ``gtFine/<split>/*/*_gtFine_labelTrainIds.png`` (split: train / val by mode)."""

    def __init__(
        self,
        dataset_root: str,
        transforms: list,
        mode: str = "train",
        seed: int = 1024,
        split: Optional[str] = None,
        num_classes: int = 19,
        ignore_index: int = 255,
    ) -> None:
        super().__init__(transforms, mode, num_classes, ignore_index)
        sec = _section(mode)
        if not os.path.isdir(dataset_root):
            raise DataPathError(f"{sec}.dataset_root: directory not found: {dataset_root}")
        self.dataset_root = dataset_root
        self.seed = seed
        self.label_list = list(CITYSCAPES_NAMES) if self.num_classes == len(CITYSCAPES_NAMES) else []
        self.split = split or ("train" if mode == "train" else "val")
        pattern = os.path.join(dataset_root, "leftImg8bit", self.split, "*", "*_leftImg8bit.png")
        images = sorted(glob.glob(pattern))
        if not images:
            raise DataError(
                f"{sec}: no Cityscapes image matches {pattern}. Expected leftImg8bit/"
                f"{self.split}/<city>/*_leftImg8bit.png with labels converted to gtFine/"
                f"{self.split}/<city>/*_gtFine_labelTrainIds.png (cityscapesScripts "
                "createTrainIdLabelImgs)"
            )
        missing = []
        for img in images:
            city = os.path.basename(os.path.dirname(img))
            stem = os.path.basename(img)[: -len("_leftImg8bit.png")]
            lbl = os.path.join(dataset_root, "gtFine", self.split, city, f"{stem}_gtFine_labelTrainIds.png")
            if not os.path.isfile(lbl):
                missing.append(lbl)
            self.items.append(_Item(img, lbl, img, True))
        if missing:
            raise DataError(
                f"{sec}: {len(missing)} Cityscapes image(s) have no *_gtFine_labelTrainIds.png "
                f"label (convert the labels to trainIds first), e.g. {', '.join(missing[:3])}"
            )
