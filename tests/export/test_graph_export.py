"""Each task's deploy module exports to ONNX (dynamic sizes) and TorchScript and matches PyTorch;
the TorchScript graphs record no device."""

from __future__ import annotations

import warnings
from typing import Iterator, List

import pytest
import torch
from ppdist_testing import tiny_config, tiny_det_config, tiny_seg_config

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.export.deploy_modules import build_deploy, task_of
from ppdist.export.graph_export import example_inputs, export_onnx, export_torchscript, onnx_parity
from ppdist.modeling.deploy import convert_to_deploy

pytest.importorskip("onnxruntime")
MAKERS = {"rec": tiny_config, "seg": tiny_seg_config, "det": tiny_det_config}


@pytest.mark.parametrize("task,exclude_nms", [("rec", False), ("seg", False), ("det", False), ("det", True)])
def test_export_matches_pytorch_at_two_sizes(tmp_path, task, exclude_nms):
    cfg = MAKERS[task](str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    overrides = ["Global.synthetic_data=null"] + (
        ["PostProcess.score_threshold=0.0"] if task == "det" else []
    )
    config = load_config(cfg, overrides)  # untrained detector: scores ~0.01, keep them all for NMS
    assert task_of(config) == task
    torch.manual_seed(0)
    model = build_model(config).eval()
    convert_to_deploy(model)
    if task == "det":  # spread the untrained scores (all ~0.01): NMS ties would make the outputs ambiguous
        for layer in model.head.pred_cls:
            torch.nn.init.normal_(layer.weight, std=0.05)
            torch.nn.init.normal_(layer.bias, std=1.0)
    module, spec = build_deploy(model, config, exclude_nms=exclude_nms)
    path = str(tmp_path / "model.onnx")
    exporter = export_onnx(module, spec, path)
    if task == "det" and not exclude_nms:
        _check_nms_graph(path, module, spec)  # the network itself is compared exactly with exclude_nms
    else:
        report = onnx_parity(path, module, spec)
        assert len(report) == 2 and report[0]["shape"] != report[1]["shape"]
        for row in report:
            for name in spec.output_names:
                assert row[name] < 1e-3, (exporter, row)
    ts_path = str(tmp_path / "model.pt")
    export_torchscript(module, spec, ts_path)
    scripted = torch.jit.load(ts_path)
    inputs = example_inputs(spec, spec.example_shapes[1], seed=5)
    with torch.no_grad():
        want, got = module(*inputs), scripted(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for a, b in zip(want, got):
        assert a.shape == b.shape and (a.float() - b.float()).abs().max() < 1e-3


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


@pytest.mark.parametrize("task", sorted(MAKERS))
def test_torchscript_graphs_record_no_device(tmp_path, task):
    """Traced on the CPU, traced and frozen (as export_torchscript writes it): no factory or copy
    names a device, so the file runs on the device it is loaded onto (tests/cuda loads it on a GPU)."""
    cfg = MAKERS[task](str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    config = load_config(cfg, ["Global.synthetic_data=null"])
    model = convert_to_deploy(build_model(config).eval())
    module, spec = build_deploy(model, config)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, example_inputs(spec, spec.example_shapes[0]), check_trace=False)
        path = str(tmp_path / "model.pt")
        export_torchscript(module, spec, path)
        frozen = torch.jit.load(path)
    for name, graph in (("traced", traced.inlined_graph), ("frozen", frozen.graph)):
        found = device_constants(graph)
        assert not found, f"the {name} {task} graph names a device in {len(found)} node(s):\n" + "\n".join(
            found
        )
