"""Text recognition (CRNN, PP-OCRv3's SVTR_LCNet): everything of the task outside the model: the
deployed module and its graph, labels, the inference runner and result writer, the synthetic
benchmark set."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import lmdb
import numpy as np
import torch
from torch import nn

from ppdist.components import build_postprocess
from ppdist.data.synthetic import generate_rec_dataset
from ppdist.tasks.registry import (
    BenchmarkData,
    BrowsePanel,
    GraphSpec,
    Task,
    eval_transform_size,
    register_task,
    write_lines,
)
from ppdist.tasks.runner import (
    Outputs,
    Result,
    Runner,
    Sample,
    build_postprocess_of,
)
from ppdist.utils import strict_json
from ppdist.utils.atomic import temporary_path

INPUTS, OUTPUTS = ("image",), ("probs",)
CHARACTERS_FILE = "characters.txt"


class RecDeploy(nn.Module):
    """image [N, 3, 32, W] -> softmax probabilities [N, T, C] (CTC frames)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out = self.model(image)  # CTCHead applies the softmax in eval mode
        return out[-1] if isinstance(out, (list, tuple)) else out


def build_rec_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    """A dynamic batch and width at the Eval resize's height (a batch of 1 and of 3 wider lines)."""
    height, width = eval_transform_size(config, (32, 100))
    spec = GraphSpec(
        list(INPUTS),
        list(OUTPUTS),
        {"image": {0: "batch", 3: "width"}, "probs": {0: "batch", 1: "frames"}},
        [(1, 3, height, width), (3, 3, height, width * 3 + 8)],
    )
    return RecDeploy(model).eval(), spec


def write_characters(out_dir: str, config: Mapping[str, Any], postprocess: Dict[str, Any]) -> Dict[str, Any]:
    """The dictionary written as ``characters.txt`` (without the CTC blank); the post-process reads it."""
    characters = build_postprocess(config).character[1:]
    write_lines(os.path.join(out_dir, CHARACTERS_FILE), characters)
    postprocess.update(character_dict_path=CHARACTERS_FILE, use_space_char=False)
    return {"num_characters": len(characters), "file": CHARACTERS_FILE}


class RecRunner(Runner):
    """Text lines -> ``{path, text, score}`` (greedy CTC decoding)."""

    task = "rec"

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self.decoder = build_postprocess_of(info)  # CTCLabelDecode

    def group_key(self, sample: Sample) -> Any:
        return tuple(np.shape(sample["image"])[:-1])  # widths are padded per batch

    def batch(self, samples: Sequence[Sample]) -> Dict[str, np.ndarray]:
        """Zero-padded on the right to the batch's widest line (PaddleOCR's predict_rec)."""
        images = [np.asarray(s["image"], dtype=np.float32) for s in samples]
        width = max(im.shape[-1] for im in images)
        out = np.zeros((len(images),) + images[0].shape[:-1] + (width,), dtype=np.float32)
        for i, im in enumerate(images):
            out[i, ..., : im.shape[-1]] = im
        return {"image": out}

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:
        """``{path, text, score}``; with the outputs of several models (``<name>/probs``, a
        distillation model's sub-models), also ``models: {name: {label, score}}`` (PaddleOCR's
        infer_rec record)."""
        decoded = self.decoder.decode_predictions(np.asarray(outputs["probs"]))
        results = [
            {"path": s["img_path"], "text": text, "score": score}
            for s, (text, score) in zip(samples, decoded)
        ]
        models = [key[: -len("/probs")] for key in outputs if key.endswith("/probs")]
        for name in models:
            for result, (text, score) in zip(
                results, self.decoder.decode_predictions(np.asarray(outputs[f"{name}/probs"]))
            ):
                result.setdefault("models", {})[name] = {"label": text, "score": score}
        return results


class RecWriter:
    """``path\ttext\tscore`` lines, printed and written to ``output_dir/results.txt``: into a
    temporary file beside it that replaces it on ``close()``, so a failed run (``abort()``) leaves
    the previous ``results.txt`` as it was. Results that hold several models' readings (a
    distillation model's sub-models) also go to ``results_per_model.txt`` the same way, one
    ``path\t{"Student": {"label", "score"}, ...}`` line each (PaddleOCR's infer_rec record, UTF-8)."""

    PER_MODEL_FILE = "results_per_model.txt"

    def __init__(self, output_dir: str, echo: bool = True) -> None:
        self.path = os.path.join(output_dir, "results.txt")
        self.per_model_path = os.path.join(output_dir, self.PER_MODEL_FILE)
        self.echo = echo
        self.tmp = temporary_path(self.path)
        self.handle = open(self.tmp, "x", encoding="utf-8")
        self.per_model: Optional[Tuple[str, IO[str]]] = None  # (temporary path, handle) once needed

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            line = f"{r['path']}\t{r['text']}\t{r['score']:.6f}"
            self.handle.write(line + "\n")
            if self.echo:
                print(line)
            if "models" in r:
                self._per_model_handle().write(
                    f"{r['path']}\t{strict_json.dumps(r['models'], ensure_ascii=False)}\n"
                )

    def _per_model_handle(self) -> IO[str]:
        if self.per_model is None:
            tmp = temporary_path(self.per_model_path)
            self.per_model = (tmp, open(tmp, "x", encoding="utf-8"))
        return self.per_model[1]

    def close(self) -> List[str]:
        self.handle.close()
        os.replace(self.tmp, self.path)
        if self.per_model is None:  # a per-model file of an earlier run would contradict results.txt
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.per_model_path)
            return [self.path]
        self.per_model[1].close()
        os.replace(self.per_model[0], self.per_model_path)
        return [self.path, self.per_model_path]

    def abort(self) -> None:
        """Drop what was written; ``results.txt`` (and ``results_per_model.txt``) stay as they were."""
        for tmp, handle in [(self.tmp, self.handle)] + ([self.per_model] if self.per_model else []):
            handle.close()
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


def rec_writer(output_dir: str, info: Mapping[str, Any], draw_threshold: float) -> "RecWriter":
    """``results.txt`` (and ``results_per_model.txt``) in ``output_dir``."""
    return RecWriter(output_dir)


def write_lmdb(path: str, samples: Sequence[Tuple[bytes, str]]) -> None:
    """An LMDB of (encoded image, label) pairs in the public text-recognition layout
    (``num-samples``, ``image-%09d``, ``label-%09d``)."""
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


def _benchmark_entry(data_dir: str, split: str, old: Mapping[str, Any]) -> Dict[str, Any]:
    """Rendered text lines (about 32 pixels high) in the LMDBs the recipe's ``LMDBDataSet`` reads."""
    keep = {k: old[k] for k in ("transforms", "batch_transforms") if k in old}
    return dict(keep, name="LMDBDataSet", data_dir=rec_lmdb(data_dir, split))


BENCHMARK_DATA = BenchmarkData(
    folder=lambda images: f"rec_{images}",
    generate=lambda data_dir, images: generate_rec_dataset(data_dir, images, images),
    dataset_entry=_benchmark_entry,
)


def browse_targets(
    reader: Any, batch: Mapping[str, Any], sample: Any, draw: bool, raw: Optional[Mapping[str, Any]]
) -> None:
    """The encoded label decoded back with the dictionary: CTC's ``label``, or PP-OCRv3's
    ``label_ctc`` (MultiLabelEncode writes the CTC and SAR labels under their own keys)."""
    labels = batch["label"] if "label" in batch else batch["label_ctc"]
    length = int(batch["length"][0])
    sample.text = "".join(reader.characters[int(i)] for i in labels[0][:length])


def browse_summary(browse: Any, counted: Sequence[Any]) -> Dict[str, Any]:
    """Characters in all and per character, label lengths."""
    return {
        "characters": sum(len(s.text) for s in counted),
        "characters_per_class": dict(Counter("".join(s.text for s in counted)).most_common()),
        "label_lengths": dict(sorted(Counter(len(s.text) for s in counted).items())),
    }


BROWSE_PANEL = BrowsePanel(
    browse_targets, browse_summary, panel_px=(400, 140), columns=3, rows_per_page=8, needs_characters=True
)


def training_sample(config: Mapping[str, Any], size: Tuple[int, int], index: int) -> Dict[str, torch.Tensor]:
    """A text-line image with a 3-6 character label (classes 1-10 exist in every dictionary, 0 is
    the CTC blank), and PP-OCRv3's multi-head labels: the CTC label and SAR targets."""
    generator = torch.Generator().manual_seed(index)
    image = torch.randn(3, *size, generator=generator)
    max_len, length = config["Global"]["max_text_length"], 3 + index % 4
    label = torch.zeros(max_len, dtype=torch.long)
    label[:length] = torch.randint(1, 11, (length,), generator=generator)
    return {
        "image": image,
        "label": label,
        "length": torch.tensor(length),
        "label_ctc": label,
        "label_sar": torch.randint(1, 11, (max_len,), generator=generator),
        "valid_ratio": torch.tensor(1.0),
    }


TASK = register_task(
    Task(
        name="rec",
        postprocesses=("CTCLabelDecode", "DistillationCTCLabelDecode"),
        inputs=INPUTS,
        outputs=OUTPUTS,
        runner=RecRunner,
        writer=rec_writer,
        benchmark_data=BENCHMARK_DATA,
        training_sample=training_sample,
        browse=BROWSE_PANEL,
        build_deploy=build_rec_deploy,
        label_files=write_characters,
    )
)
