"""The deploy modules give the same outputs on CUDA as on CPU, eager and as exported TorchScript
(traced on the CPU, loaded onto the GPU: the graphs record no device)."""

import pytest
import torch
from faster_rcnn_testing import tiny_faster_rcnn_config
from ppdist_testing import spread_class_scores, tiny_config, tiny_det_config, tiny_seg_config

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.export.deploy_modules import build_deploy
from ppdist.export.graph_export import example_inputs, export_torchscript
from ppdist.modeling.deploy import convert_to_deploy

MAKERS = {
    "rec": tiny_config,
    "seg": tiny_seg_config,
    "det": tiny_det_config,
    "faster_rcnn": tiny_faster_rcnn_config,
}


def _deploy(tmp_path, task, exclude_nms):
    cfg = MAKERS[task](str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    overrides = ["Global.synthetic_data=null"] + (
        ["PostProcess.score_threshold=0.0"] if task == "det" else []  # Faster R-CNN: 0.05
    )
    config = load_config(cfg, overrides)
    torch.manual_seed(0)
    model = convert_to_deploy(build_model(config).eval())
    if task in ("det", "faster_rcnn"):  # spread the untrained scores, as tests/export does: no NMS ties
        spread_class_scores(model)
    return build_deploy(model, config, exclude_nms=exclude_nms)


def _tuple(out):
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


@pytest.mark.parametrize(
    "task,exclude_nms",
    [("rec", False), ("seg", False), ("det", True), ("det", False), ("faster_rcnn", False)],
)
def test_export_parity_on_cuda(tmp_path, task, exclude_nms):
    module, spec = _deploy(tmp_path, task, exclude_nms)
    inputs = example_inputs(spec, spec.example_shapes[0], seed=3)
    with torch.no_grad():
        want = _tuple(module(*inputs))
    path = str(tmp_path / "model.pt")
    export_torchscript(module, spec, path)  # traced on the CPU, as tools/export_model.py does
    scripted = torch.jit.load(path, map_location="cuda")
    module.cuda()
    with torch.no_grad():
        eager = _tuple(module(*[x.cuda() for x in inputs]))
        traced = _tuple(scripted(*[x.cuda() for x in inputs]))
    for b, c in zip(eager, traced):
        assert c.is_cuda and b.shape == c.shape
        assert torch.allclose(b.float(), c.float(), atol=1e-4, rtol=1e-4)
    if task in ("det", "faster_rcnn") and not exclude_nms:
        return  # detections after NMS: CPU and GPU float differences may flip a decision at a threshold
    for a, b in zip(want, eager):
        assert torch.allclose(a.float(), b.float().cpu(), atol=1e-3, rtol=1e-3)
