"""Table structure recognition (SLANet): everything of the task outside the model: the
deployed module and its graph, labels, the inference runner and result writer, the synthetic
benchmark set."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
from torch import nn

from ppdist.components import build_postprocess
from ppdist.data.synthetic_table import generate_table_dataset
from ppdist.metrics.teds import structure_html
from ppdist.tasks.registry import BenchmarkData, BrowsePanel, GraphSpec, Task, register_task, write_lines
from ppdist.tasks.result_files import (
    file_stem,
)
from ppdist.tasks.runner import (
    Outputs,
    Result,
    Runner,
    Sample,
    build_postprocess_of,
)
from ppdist.tasks.table_browse import (
    cell_boxes,
    raw_structure_length,
    structure_tokens,
    table_grid,
    table_summary,
)
from ppdist.utils import strict_json
from ppdist.utils.atomic import temporary_path, write_text_atomic
from ppdist.visualize.palette import class_colour

INPUTS, OUTPUTS = ("image",), ("structure_probs", "loc_preds")
STRUCTURE_FILE = "structure_tokens.txt"


def scripted(module: nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script(module)`` without the deprecation warning recent torch versions print
    on each call: TorchScript is what keeps the decode one loop in the exported graphs, used knowingly."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is", category=FutureWarning)
        return torch.jit.script(module)


class TableDeploy(nn.Module):
    """image [N, 3, H, W] (PaddingTableImage's size) -> ``structure_probs`` [N, L, C] (softmax) and
    ``loc_preds`` [N, L, R] (normalised boxes), L = max_text_length + 1: SLANet's eval forward. The
    backbone and neck are traced; the head's greedy decode (``SLAHead.decoder``) is scripted, so the
    exported graphs keep its steps as one loop (``graph_export`` traces before the ONNX export)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.backbone = model.backbone
        self.neck = model.neck
        self.flat_features = model.head.flat_features  # no parameters: (B, C, H, W) -> (B, H*W, C)
        self.decode = scripted(model.head.decoder())

    def forward(self, image: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        feats = self.backbone(image)
        feats = feats if self.neck is None else self.neck(feats)
        return self.decode(self.flat_features(feats))


def table_input_size(config: Mapping[str, Any]) -> List[int]:
    """[H, W] of the Eval ``PaddingTableImage.size`` (every image is padded to it), else 488x488."""
    for entry in (config.get("Eval") or {}).get("dataset", {}).get("transforms", []) or []:
        if isinstance(entry, Mapping) and "PaddingTableImage" in entry:
            return [int(v) for v in (entry["PaddingTableImage"] or {}).get("size", (488, 488))]
    return [488, 488]


def build_table_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    """A fixed image size (the padded one), a dynamic batch."""
    height, width = table_input_size(config)
    axes = {name: {0: "batch"} for name in INPUTS + OUTPUTS}
    spec = GraphSpec(list(INPUTS), list(OUTPUTS), axes, [(1, 3, height, width), (2, 3, height, width)])
    return TableDeploy(model).eval(), spec


def write_structure_tokens(
    out_dir: str, config: Mapping[str, Any], postprocess: Dict[str, Any]
) -> Dict[str, Any]:
    """The structure tokens as ``TableLabelDecode`` holds them (``merge_no_span_structure`` applied,
    without ``sos`` / ``eos``) written as ``structure_tokens.txt``: read back with the same setting,
    they give the same classes."""
    classes = build_postprocess(config).character
    write_lines(os.path.join(out_dir, STRUCTURE_FILE), classes[1:-1])
    postprocess.update(character_dict_path=STRUCTURE_FILE)
    return {"num_classes": len(classes), "file": STRUCTURE_FILE}


class TableRunner(Runner):
    """Table images -> ``{path, structure (HTML tokens), html, score, boxes [n_cells, loc_reg_num]
    on the original image}`` (``TableLabelDecode`` with the ``shape`` of ``ResizeTableImage`` /
    ``PaddingTableImage``); ``html`` is the structure wrapped as PaddleOCR's predict_table does."""

    task = "table"

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self.decoder = build_postprocess_of(info)  # TableLabelDecode

    def finish(self, data: Sample) -> Sample:
        return {
            "img_path": data["img_path"],
            "image": data["image"],
            "shape": np.asarray(data["shape"], dtype=np.float32).reshape(-1),
        }

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:
        locs = np.asarray(outputs["loc_preds"], dtype=np.float32)
        decoded = self.decoder(
            {"structure_probs": np.asarray(outputs["structure_probs"]), "loc_preds": locs},
            {"shape": np.stack([s["shape"] for s in samples])},
        )
        results = []
        for sample, (tokens, score), boxes in zip(
            samples, decoded["structure_batch_list"], decoded["bbox_batch_list"]
        ):
            results.append(
                {
                    "path": sample["img_path"],
                    "structure": list(tokens),
                    "html": structure_html(tokens),
                    "score": score,
                    "boxes": boxes.reshape(-1, locs.shape[-1]),
                }
            )
        return results


class TableWriter:
    """``output_dir/results.jsonl``, one ``{"path", "html", "score", "boxes"}`` line per image
    (PaddleOCR's infer_table record: the structure wrapped in ``<html><body><table>``, the cell boxes
    on the original image), written to a temporary file that replaces it on ``close()``; per image
    ``<stem>.html`` (that HTML) and ``<name>`` (the image with the cell boxes drawn: rectangles for
    4 coordinates, closed polygons for 8, in class 0's colour of ``ppdist.visualize.palette``)."""

    RESULTS_FILE = "results.jsonl"

    def __init__(self, output_dir: str, thickness: int = 2) -> None:
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, self.RESULTS_FILE)
        self.tmp = temporary_path(self.path)
        self.handle = open(self.tmp, "x", encoding="utf-8")
        self.thickness = thickness
        self.written: List[str] = []

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            boxes = np.asarray(r["boxes"], dtype=np.float32)
            record = {"path": r["path"], "html": r["html"], "score": r["score"], "boxes": boxes.tolist()}
            self.handle.write(strict_json.dumps(record, ensure_ascii=False) + "\n")
            html_path = os.path.join(self.output_dir, file_stem(r["path"]) + ".html")
            write_text_atomic(html_path, r["html"])
            self.written += [html_path, self.draw(r["path"], boxes)]

    def draw(self, image_path: str, boxes: np.ndarray) -> str:
        image = cv2.imread(image_path, cv2.IMREAD_COLOR)
        red, green, blue = class_colour(0)
        for box in boxes:
            if len(box) == 4:
                x1, y1, x2, y2 = (int(round(float(v))) for v in box)
                cv2.rectangle(image, (x1, y1), (x2, y2), (blue, green, red), self.thickness)
            else:
                points = np.round(box.reshape(-1, 1, 2)).astype(np.int32)
                cv2.polylines(image, [points], True, (blue, green, red), self.thickness)
        path = os.path.join(self.output_dir, os.path.basename(image_path))
        cv2.imwrite(path, image)
        return path

    def close(self) -> List[str]:
        self.handle.close()
        os.replace(self.tmp, self.path)
        return [self.path] + self.written

    def abort(self) -> None:
        """Drop what was written; ``results.jsonl`` stays as it was."""
        self.handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


def table_writer(output_dir: str, info: Mapping[str, Any], draw_threshold: float) -> "TableWriter":
    """``results.jsonl``, one HTML file and one picture with the cell boxes per table."""
    return TableWriter(output_dir)


BENCHMARK_GRID = (20, 10)  # most rows and columns of a synthetic table (PubTabNet-sized pictures)


def _benchmark_entry(data_dir: str, split: str, old: Mapping[str, Any]) -> Dict[str, Any]:
    """PubTabNet's jsonl layout of ``generate_table_dataset`` (``PubTabDataSet``)."""
    entry = {k: v for k, v in old.items() if k not in ("data_dir", "label_file_list")}
    return dict(entry, data_dir=data_dir, label_file_list=[os.path.join(data_dir, f"{split}.txt")])


BENCHMARK_DATA = BenchmarkData(
    folder=lambda images: f"table_{images}",
    generate=lambda data_dir, images: generate_table_dataset(
        data_dir, images, images, max_rows=BENCHMARK_GRID[0], max_cols=BENCHMARK_GRID[1]
    ),
    dataset_entry=_benchmark_entry,
)


def browse_targets(
    reader: Any, batch: Mapping[str, Any], sample: Any, draw: bool, raw: Optional[Mapping[str, Any]]
) -> None:
    """The encoded structure decoded back to tokens, its grid, the learned cell boxes."""
    structure, length = batch["structure"][0].numpy(), int(batch["length"][0])
    sample.structure = structure_tokens(structure, length, reader.characters)
    sample.grid = table_grid(sample.structure)
    sample.boxes = cell_boxes(
        batch["bboxes"][0].numpy(),
        batch["bbox_masks"][0].numpy(),
        batch["shape"][0].numpy(),
        reader.box_format,
    )


def browse_on_read(reader: Any, raw: Optional[Mapping[str, Any]], browse: Any) -> None:
    """Every table read, a rejected one too, has its structure length counted (``raw``: the sample
    as read, None when it cannot be read)."""
    length = raw_structure_length(reader.table_encoder, raw)
    if length is not None:
        browse.structure_lengths.append(length)


def browse_summary(browse: Any, counted: Sequence[Any]) -> Dict[str, Any]:
    """Rows, columns, cells, spanning cells and structure lengths (``ppdist.tasks.table_browse.table_summary``)."""
    return table_summary(
        [s.grid for s in counted],
        [len(s.structure) for s in counted],
        browse.structure_lengths,
        browse.max_text_length,
    )


BROWSE_PANEL = BrowsePanel(
    browse_targets,
    browse_summary,
    panel_px=(400, 440),
    columns=3,
    rows_per_page=2,
    needs_characters=True,
    on_read=browse_on_read,
)


def training_sample(config: Mapping[str, Any], size: Tuple[int, int], index: int) -> Dict[str, torch.Tensor]:
    """SLANet's sample: sos, 4-8 structure tokens valid in every structure dictionary, eos,
    padding; cell boxes on about 60% of the tokens."""
    generator = torch.Generator().manual_seed(index)
    height, width = size
    image = torch.randn(3, height, width, generator=generator)
    steps, length = config["Global"]["max_text_length"] + 2, 4 + index % 5
    structure = torch.zeros(steps, dtype=torch.long)
    structure[1 : length + 1] = torch.randint(1, 28, (length,), generator=generator)
    structure[length + 1] = 29
    masks = torch.zeros(steps)
    masks[1 : length + 1] = (torch.rand(length, generator=generator) < 0.6).float()
    reg = config["Architecture"]["Head"].get("loc_reg_num", 4)
    return {
        "image": image,
        "structure": structure,
        "bboxes": torch.rand(steps, reg, generator=generator) * masks.unsqueeze(-1),
        "bbox_masks": masks,
        "length": torch.tensor(length),
        "shape": torch.tensor([height, width, 1.0, 1.0, height, width]),
    }


TASK = register_task(
    Task(
        name="table",
        postprocesses=("TableLabelDecode",),
        inputs=INPUTS,
        outputs=OUTPUTS,
        runner=TableRunner,
        writer=table_writer,
        benchmark_data=BENCHMARK_DATA,
        training_sample=training_sample,
        browse=BROWSE_PANEL,
        build_deploy=build_table_deploy,
        label_files=write_structure_tokens,
    )
)
