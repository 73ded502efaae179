"""Synthetic data at a recipe's real image size for the input-pipeline measurement
(``tools/benchmark.py --input_pipeline --synthetic``): the config keeps its transforms, loaders and
batch transforms; only where the images come from changes.

- det: COCO-like JPEGs of 640x480 (COCO's typical size) in COCO layout (``COCODataSet``);
- seg: Cityscapes-sized 2048x1024 JPEGs with PNG labels (``SegDataSet`` file lists);
- rec: rendered text lines (about 32 pixels high) packed into LMDBs in the public layout the
  recipe's ``LMDBDataSet`` reads (``num-samples``, ``image-%09d``, ``label-%09d``);
- table: rendered tables of up to ``TABLE_GRID`` rows x columns (PubTabNet-sized pictures, about
  200 to 900 pixels a side) in PubTabNet's jsonl layout (``PubTabDataSet``); the recipe's
  teacher-forced step runs ``max_text_length + 2`` decoder steps whatever the table.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, Mapping, Sequence, Tuple

import lmdb

from ppdist.data.synthetic import generate_rec_dataset
from ppdist.data.synthetic_det import generate_det_dataset
from ppdist.data.synthetic_seg import generate_seg_dataset
from ppdist.data.synthetic_table import generate_table_dataset
from ppdist.tasks import task_of

REAL_SIZES = {"det": (640, 480), "seg": (2048, 1024)}  # [width, height]
SECTIONS = {"Train": "train", "Eval": "val"}
TABLE_GRID = (20, 10)  # most rows and columns of a synthetic table


def synthetic_folder(root: str, task: str, images: int) -> str:
    size = REAL_SIZES.get(task)
    return os.path.join(root, f"{task}_{size[0]}x{size[1]}_{images}" if size else f"{task}_{images}")


def write_lmdb(path: str, samples: Sequence[Tuple[bytes, str]]) -> None:
    """An LMDB of (encoded image, label) pairs in the public text-recognition layout."""
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(path, map_size=max(1 << 24, 2 * sum(len(image) + 64 for image, _ in samples)))
    with env.begin(write=True) as txn:
        for i, (image, label) in enumerate(samples, start=1):
            txn.put(b"image-%09d" % i, image)
            txn.put(b"label-%09d" % i, label.encode("utf-8"))
        txn.put(b"num-samples", str(len(samples)).encode())
    env.close()


def rec_lmdb(data_dir: str, split: str) -> str:
    """``data_dir``'s ``split`` list packed into ``data_dir/lmdb/split`` (once)."""
    path = os.path.join(data_dir, "lmdb", split)
    if not os.path.isfile(os.path.join(path, "data.mdb")):
        with open(os.path.join(data_dir, f"{split}.txt"), encoding="utf-8") as handle:
            lines = [line.rstrip("\n").split("\t", 1) for line in handle if line.strip()]
        samples = []
        for rel, label in lines:
            with open(os.path.join(data_dir, rel), "rb") as image:
                samples.append((image.read(), label))
        write_lmdb(path, samples)
    return path


def _dataset_entry(task: str, data_dir: str, split: str, old: Mapping[str, Any]) -> Dict[str, Any]:
    keep = {k: old[k] for k in ("transforms", "batch_transforms") if k in old}
    if task == "det":
        entry = {k: v for k, v in old.items() if k not in ("dataset_dir", "image_dir", "anno_path")}
        entry.update(
            dataset_dir=data_dir,
            image_dir=f"images/{split}",
            anno_path=f"annotations/instances_{split}.json",
        )
        return entry
    if task == "seg":
        key = "train_path" if split == "train" else "val_path"
        return dict(keep, name="SegDataSet", dataset_root=data_dir, **{key: f"{split}.txt"})
    if task == "table":
        entry = {k: v for k, v in old.items() if k not in ("data_dir", "label_file_list")}
        return dict(entry, data_dir=data_dir, label_file_list=[os.path.join(data_dir, f"{split}.txt")])
    return dict(keep, name="LMDBDataSet", data_dir=rec_lmdb(data_dir, split))


def with_synthetic_data(config: Mapping[str, Any], root: str, images: int) -> Dict[str, Any]:
    """``config`` reading a synthetic set of ``images`` train and val images at the recipe's real
    size (drawn under ``root`` the first time, seed 0)."""
    task = task_of(config)
    data_dir = os.path.abspath(synthetic_folder(root, task, images))
    if task == "det":
        generate_det_dataset(data_dir, images, images, image_size=list(REAL_SIZES["det"]), empty_ratio=0.0)
    elif task == "seg":
        generate_seg_dataset(data_dir, images, images, image_size=list(REAL_SIZES["seg"]))
    elif task == "rec":
        generate_rec_dataset(data_dir, images, images)
    elif task == "table":
        generate_table_dataset(data_dir, images, images, max_rows=TABLE_GRID[0], max_cols=TABLE_GRID[1])
    else:
        raise ValueError(f"no synthetic data for model_type {task!r}")
    config = copy.deepcopy(dict(config))
    for section, split in SECTIONS.items():
        if config.get(section):
            config[section]["dataset"] = _dataset_entry(task, data_dir, split, config[section]["dataset"])
    return config
