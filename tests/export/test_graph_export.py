"""Each task's deploy module exports to ONNX (dynamic sizes) and TorchScript and matches PyTorch;
the TorchScript graphs record no device. Segmentation: PP-LiteSeg, and small SegFormer / OCRNet
models (relative differences <= 1e-4, also at an odd size, where HRNet's 'same' padding changes)."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Iterator, List

import pytest
import torch
from faster_rcnn_testing import tiny_faster_rcnn_config
from ppdist_testing import spread_class_scores, tiny_config, tiny_det_config, tiny_seg_config

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.errors import ConfigError
from ppdist.export.deploy_modules import build_deploy
from ppdist.export.graph_export import example_inputs, export_onnx, export_torchscript, onnx_parity
from ppdist.export.model_export import export_single
from ppdist.modeling.deploy import convert_to_deploy
from ppdist.tasks import task_of

pytest.importorskip("onnxruntime")
# case -> config maker; the case's task is what task_of reads from the config
MAKERS = {
    "rec": tiny_config,
    "seg": tiny_seg_config,
    "det": tiny_det_config,
    "segformer": functools.partial(tiny_seg_config, model="segformer"),
    "ocrnet": functools.partial(tiny_seg_config, model="ocrnet"),
    "faster_rcnn": tiny_faster_rcnn_config,
    "cascade_rcnn": functools.partial(tiny_faster_rcnn_config, cascade=True),
}
TASKS = {"segformer": "seg", "ocrnet": "seg", "faster_rcnn": "det", "cascade_rcnn": "det"}
DEVICE_CASES = (
    "rec",
    "seg",
    "det",
    "faster_rcnn",
    "cascade_rcnn",
)  # the others' graphs are checked for devices by the export test
# largest difference allowed, relative to the output's magnitude where it exceeds 1 (onnx_parity's rule)
TOLERANCE = {"segformer": 1e-4, "ocrnet": 1e-4}
ODD_SIZE = (1, 3, 71, 101)  # 71x101 -> 36x51 -> 18x26 -> 9x13 -> 5x7 -> 3x4: odd sizes at every stride


def _spread_ocrnet_outputs(model: torch.nn.Module) -> None:
    """PaddleSeg's OCRNet init (convs Normal(0, 0.001), BN statistics 0/1) gives logits ~1e-21, too
    small to compare: BN statistics from one random batch, classifiers of unit-scale outputs."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # the batch's own statistics
    with torch.no_grad():
        model.train()(torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3)))
    model.eval()
    for layer in (model.head.cls_head, model.head.aux_head[1]):
        torch.nn.init.normal_(layer.weight, std=0.5)


def _largest_difference(want: torch.Tensor, got: torch.Tensor) -> float:
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    return float((want.float() - got.float()).abs().max()) / scale


@pytest.mark.parametrize(
    "case,exclude_nms",
    [
        ("rec", False),
        ("seg", False),
        ("det", False),
        ("det", True),
        ("segformer", False),
        ("ocrnet", False),
        ("faster_rcnn", False),
        ("cascade_rcnn", False),
    ],
)
@pytest.mark.slow
def test_export_matches_pytorch_at_two_sizes(tmp_path, case, exclude_nms):
    task = TASKS.get(case, case)
    cfg = MAKERS[case](str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    overrides = ["Global.synthetic_data=null"] + (
        ["PostProcess.score_threshold=0.0"] if case == "det" else []
    )
    config = load_config(cfg, overrides)  # untrained detector: scores ~0.01, keep them all for NMS
    assert task_of(config) == task
    torch.manual_seed(0)
    model = build_model(config).eval()
    if case == "ocrnet":
        _spread_ocrnet_outputs(model)
    convert_to_deploy(model)
    if task == "det":  # spread the untrained scores (all ~0.01): NMS ties would make the outputs ambiguous
        spread_class_scores(model)
    module, spec = build_deploy(model, config, exclude_nms=exclude_nms)
    tolerance = TOLERANCE.get(case, 1e-3)
    path = str(tmp_path / "model.onnx")
    exporter = export_onnx(module, spec, path)
    if task == "det" and not exclude_nms:
        _check_nms_graph(path, module, spec)  # the network itself is compared exactly with exclude_nms
    else:
        sizes = 3 if case in TOLERANCE else 2
        if case in TOLERANCE:  # the exported sizes plus an odd one
            spec = dataclasses.replace(spec, example_shapes=spec.example_shapes + [ODD_SIZE])
        report = onnx_parity(path, module, spec)
        assert len(report) == sizes and report[0]["shape"] != report[1]["shape"]
        for row in report:
            for name in spec.output_names:
                assert row[name] <= tolerance, (exporter, row)
    ts_path = str(tmp_path / "model.pt")
    export_torchscript(module, spec, ts_path)
    scripted = torch.jit.load(ts_path)
    for shape in spec.example_shapes[1:]:
        inputs = example_inputs(spec, shape, seed=5)
        with torch.no_grad():
            want, got = module(*inputs), scripted(*inputs)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip(want, got):
            assert a.shape == b.shape and _largest_difference(a, b) <= tolerance, (shape, a.shape, b.shape)
    if case not in DEVICE_CASES:  # test_torchscript_graphs_record_no_device's check, on this file
        _assert_no_device(case, {"traced": _traced_graph(module, spec), "frozen": scripted.graph})


def test_seg_export_sizes_read_paddleseg_resize_as_width_height():
    """PaddleSeg's ``Resize.target_size`` is [w, h]: a 96-wide, 64-high Eval resize exports at 64x96."""
    config = {
        "PostProcess": {"name": "SegPostProcess"},
        "Eval": {"dataset": {"transforms": [{"Resize": {"target_size": [96, 64]}}, {"Normalize": {}}]}},
    }
    _, spec = build_deploy(torch.nn.Conv2d(3, 2, 1), config)
    assert spec.example_shapes == [(1, 3, 64, 96), (2, 3, 64, 112)]


def _check_nms_graph(path, module, spec):
    """Same detections per image and the same scores; among anchors with equal scores (an untrained
    net gives equal scores to equal features) ONNX Runtime's TopK may pick another one."""
    import onnxruntime as ort

    session = ort.InferenceSession(path)
    for seed, shape in enumerate(spec.example_shapes):
        inputs = example_inputs(spec, shape, seed=seed + 1)
        with torch.no_grad():
            bbox, num = module(*inputs)
        got_bbox, got_num = session.run(None, {n: t.numpy() for n, t in zip(spec.input_names, inputs)})
        assert got_num.tolist() == num.tolist() and bbox.shape[0] > 0
        assert abs(got_bbox[:, :2] - bbox[:, :2].numpy()).max() < 1e-5  # labels and scores, in order


def _nodes(block) -> Iterator[torch._C.Node]:
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def device_constants(graph) -> List[str]:
    """The nodes of ``graph`` (and of its nested blocks) that take a constant ``Device``, e.g.
    ``aten::arange(..., device="cpu")`` traced on the CPU: such a graph fails on any other device
    (``torch.jit.load(map_location=...)`` moves tensors, not Device constants)."""
    found = []
    for node in _nodes(graph):
        for value in node.inputs():
            if value.type().kind() == "DeviceObjType" and value.node().kind() == "prim::Constant":
                where = node.sourceRange().strip().splitlines()[0] if node.sourceRange() else "?"
                found.append(f"{node.kind()} with device={value.toIValue()} ({where})")
    return found


def _traced_graph(module: torch.nn.Module, spec) -> torch._C.Graph:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, example_inputs(spec, spec.example_shapes[0]), check_trace=False)
    return traced.inlined_graph


def _assert_no_device(case: str, graphs) -> None:
    for name, graph in graphs.items():
        found = device_constants(graph)
        assert not found, f"the {name} {case} graph names a device in {len(found)} node(s):\n" + "\n".join(
            found
        )


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_torchscript_graphs_record_no_device(tmp_path, case):
    """Traced on the CPU, traced and frozen (as export_torchscript writes it): no factory or copy
    names a device, so the file runs on the device it is loaded onto (tests/cuda loads it on a GPU)."""
    cfg = MAKERS[case](str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    config = load_config(cfg, ["Global.synthetic_data=null"])
    model = convert_to_deploy(build_model(config).eval())
    module, spec = build_deploy(model, config)
    path = str(tmp_path / "model.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_torchscript(module, spec, path)
        frozen = torch.jit.load(path)
    _assert_no_device(case, {"traced": _traced_graph(module, spec), "frozen": frozen.graph})


def test_faster_rcnn_refuses_exclude_nms_in_one_line(tmp_path):
    """Faster R-CNN's boxes are per class: its graph keeps the NMS; --exclude_nms is a config error."""
    cfg = tiny_faster_rcnn_config(str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    config = load_config(cfg, ["Global.synthetic_data=null"])
    with pytest.raises(ConfigError, match="--exclude_nms: PostProcess BBoxPostProcess keeps its NMS"):
        build_deploy(build_model(config).eval(), config, exclude_nms=True)


def test_faster_rcnn_export_check_compares_the_whole_graph(tmp_path):
    """--check on a graph that keeps its NMS compares ``bbox`` / ``bbox_num`` themselves (there is
    no raw graph to compare instead)."""
    cfg = tiny_faster_rcnn_config(str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    config = load_config(cfg, ["Global.synthetic_data=null"])
    torch.manual_seed(0)
    model = convert_to_deploy(build_model(config).eval())
    spread_class_scores(model)
    report = export_single(model, config, str(tmp_path / "inf"), {}, ("onnx",), False, True, 1e-4)
    assert [sorted(row) for row in report["parity"]] == [["bbox", "bbox_num", "shape"]] * 2
    assert report["max_abs_diff"] <= 1e-4
