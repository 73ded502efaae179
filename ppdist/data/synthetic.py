"""Synthetic datasets for tests, demos and smoke training runs.

``generate_rec_dataset`` renders random text lines with real fonts into a PaddleOCR
``SimpleDataSet`` layout::

    out_dir/images/train/00000000.jpg   out_dir/train.txt   ("images/train/00000000.jpg\\tLabel")
    out_dir/images/val/00000000.jpg     out_dir/val.txt

Validation strings never occur in the training set (compared case-insensitively).
``generate_seg_dataset`` (``ppdist.data.synthetic_seg``) draws segmentation data and
``generate_det_dataset`` (``ppdist.data.synthetic_det``) detection data in COCO layout; the three
are registered in ``ppdist.registry.SYNTHETIC_DATA`` as ``rec``, ``seg`` and ``det``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Set, Tuple

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ppdist.data.synthetic_io import SyntheticSettingError, build_atomically, check_lengths, check_setting
from ppdist.registry import SYNTHETIC_DATA

FONT_ROOT = "/usr/share/fonts"
PREFERRED_FACES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansCondensed.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSerif-Italic.ttf",
)
AMBIGUOUS_UPPER = frozenset("ilo")  # their capitals look like "l", "I"/"1" and "0" in some faces
FONT_SIZES = tuple(range(22, 31))  # pixels; with the padding below images are ~30-48 px high


def find_fonts(root: str = FONT_ROOT) -> List[str]:
    """Paths of a few DejaVu faces under ``root`` (preferred faces first), or [] if none."""
    found: Dict[str, str] = {}
    if os.path.isdir(root):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if name.startswith("DejaVu") and name.endswith(".ttf"):
                    found.setdefault(name, os.path.join(dirpath, name))
    return [found[name] for name in PREFERRED_FACES if name in found]


@lru_cache(maxsize=None)
def _font(path: Optional[str], size: int) -> ImageFont.FreeTypeFont:
    if path is None:
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(path, size)


def _random_strings(
    rng: np.random.Generator, count: int, charset: str, min_len: int, max_len: int, exclude: Set[str]
) -> List[str]:
    """``count`` random strings whose lower-cased form is not in ``exclude``."""
    chars = np.array(list(charset))
    out: List[str] = []
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 50 * count + 1000:
            raise SyntheticSettingError(
                "charset",
                f"({len(charset)} characters) with lengths {min_len}-{max_len} cannot give {count} distinct "
                f"strings outside the training set: more characters or longer lines",
            )
        n = int(rng.integers(min_len, max_len + 1))
        text = "".join(chars[rng.integers(0, len(chars), n)])
        if text.lower() in exclude:
            continue
        out.append(text)
    return out


def _vary_case(rng: np.random.Generator, text: str, upper_prob: float) -> str:
    """Upper-case a random subset of letters (whole words sometimes, for realism)."""
    mode = rng.random()
    if mode < 0.15:
        return text.upper()
    if mode < 0.3:
        return text[:1].upper() + text[1:]
    flips = rng.random(len(text)) < upper_prob
    return "".join(c.upper() if f else c for c, f in zip(text, flips))


def _vary_case_safe(rng: np.random.Generator, text: str, upper_prob: float) -> str:
    """``_vary_case`` but never upper-cases i, l, o: "I" vs "l" and "O" vs "0" are ambiguous."""
    varied = _vary_case(rng, text, upper_prob)
    return "".join(b if b in AMBIGUOUS_UPPER else v for v, b in zip(varied, text))


def _colours(rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """Background and foreground BGR colours whose luminances differ by at least 90."""
    bg_lum = rng.uniform(0, 255)
    if bg_lum > 127:
        fg_lum = rng.uniform(0, bg_lum - 90)
    else:
        fg_lum = rng.uniform(bg_lum + 90, 255)
    tint_bg = rng.uniform(-35, 35, 3)
    tint_fg = rng.uniform(-35, 35, 3)
    bg = np.clip(bg_lum + tint_bg - tint_bg.mean(), 0, 255)
    fg = np.clip(fg_lum + tint_fg - tint_fg.mean(), 0, 255)
    return bg.astype(np.float32), fg.astype(np.float32)


def render_text_line(text: str, rng: np.random.Generator, fonts: Sequence[Optional[str]]) -> np.ndarray:
    """A BGR uint8 image of ``text``: random face, size, padding, colours, tilt, blur, noise."""
    font = _font(fonts[int(rng.integers(len(fonts)))], int(rng.choice(FONT_SIZES)))
    ascent, descent = font.getmetrics()
    left, _, right, _ = font.getbbox(text)
    pad_l, pad_r = (int(v) for v in rng.integers(1, 10, 2))
    pad_t, pad_b = (int(v) for v in rng.integers(2, 8, 2))
    text_w = int(right - min(left, 0))
    angle = rng.uniform(-2.0, 2.0) if rng.random() < 0.3 else 0.0  # mild tilt
    lift = int(np.ceil(abs(np.tan(np.radians(angle))) * (text_w / 2.0 + pad_l)))  # keeps ends inside
    pad_t, pad_b = max(pad_t, lift), max(pad_b, lift)
    width = text_w + pad_l + pad_r
    height = int(ascent + descent) + pad_t + pad_b
    mask_img = Image.new("L", (width, height), 0)
    ImageDraw.Draw(mask_img).text((pad_l - min(left, 0), pad_t), text, fill=255, font=font)
    mask = np.asarray(mask_img, dtype=np.float32) * (1.0 / 255.0)
    if angle:
        rot = cv2.getRotationMatrix2D((width / 2.0, height / 2.0), angle, 1.0)
        mask = cv2.warpAffine(
            mask, rot, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0
        )
    bg, fg = _colours(rng)
    if rng.random() < 0.3:  # horizontal background gradient
        ramp = np.linspace(0.0, rng.uniform(-40, 40), width, dtype=np.float32)[None, :, None]
        background = bg[None, None, :] + ramp
    else:
        background = np.broadcast_to(bg[None, None, :], (1, 1, 3))
    img = background + (fg - background) * mask[:, :, None]
    if rng.random() < 0.5:
        img = cv2.GaussianBlur(img, (0, 0), float(rng.uniform(0.4, 1.1)))
    sigma = rng.uniform(0.0, 8.0)
    if sigma > 1.0:  # luminance noise (one plane shared by the three channels: cheap)
        img = img + sigma * rng.standard_normal((height, width, 1), dtype=np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _write_split(
    root: str,
    split: str,
    strings: List[str],
    seed: int,
    split_id: int,
    fonts: Sequence[Optional[str]],
    upper_prob: float,
) -> None:
    img_dir = os.path.join(root, "images", split)
    os.makedirs(img_dir)
    lines = []
    params = [cv2.IMWRITE_JPEG_QUALITY, 95]
    for i, base in enumerate(strings):
        rng = np.random.default_rng([seed & 0xFFFFFFFF, split_id, i])
        text = _vary_case_safe(rng, base, upper_prob) if upper_prob > 0 else base
        img = render_text_line(text, rng, fonts)
        rel = f"images/{split}/{i:08d}.jpg"
        ok, buf = cv2.imencode(".jpg", img, params)
        if not ok:
            raise RuntimeError(f"could not encode {rel}")
        with open(os.path.join(root, rel), "wb") as handle:
            handle.write(buf.tobytes())
        lines.append(f"{rel}\t{text}\n")
    with open(os.path.join(root, f"{split}.txt"), "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(lines)


@SYNTHETIC_DATA.register(name="rec")
def generate_rec_dataset(
    out_dir: str,
    num_train: int,
    num_val: int,
    seed: int = 0,
    min_len: int = 3,
    max_len: int = 8,
    charset: str = "0123456789abcdefghijklmnopqrstuvwxyz",
    upper_case_ratio: Optional[float] = None,
) -> dict:
    """Render a text-recognition dataset into ``out_dir`` (skipped if ``out_dir/train.txt`` exists).

    Deterministic for a seed. When ``charset`` has lower-case letters but no upper-case ones,
    some letters (``upper_case_ratio``, default 0.25; 0 disables it) are rendered in upper case and the label is the exact rendered string (the
    default-dictionary CTC encoder lower-cases it). Built in a temporary directory beside
    ``out_dir`` and renamed into place, so a half-written dataset is never visible.
    Returns a summary dict.
    """
    check_lengths(min_len, max_len)
    check_setting(
        isinstance(charset, str) and bool(charset) and not any(c in "\t\n\r" for c in charset),
        "charset",
        "a non-empty string without tab or newline",
        charset,
    )
    out_dir = os.path.abspath(out_dir)
    fonts: List[Optional[str]] = list(find_fonts()) or [None]
    font_names = [os.path.basename(f) if f else "pillow-default" for f in fonts]
    summary = {"task": "rec", "out_dir": out_dir, "seed": seed, "fonts": font_names}
    auto_case = any(c.islower() for c in charset) and not any(c.isupper() for c in charset)
    upper_prob = (0.25 if auto_case else 0.0) if upper_case_ratio is None else float(upper_case_ratio)

    def write(tmp: str) -> None:
        rng = np.random.default_rng(seed & 0xFFFFFFFF)
        train = _random_strings(rng, num_train, charset, min_len, max_len, exclude=set())
        val = _random_strings(rng, num_val, charset, min_len, max_len, exclude={s.lower() for s in train})
        _write_split(tmp, "train", train, seed, 0, fonts, upper_prob)
        _write_split(tmp, "val", val, seed, 1, fonts, upper_prob)

    settings = dict(
        seed=seed, min_len=min_len, max_len=max_len, charset=charset, upper_case_ratio=upper_case_ratio
    )
    return build_atomically(out_dir, summary, num_train, num_val, write, settings)
