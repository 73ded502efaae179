"""The deploy modules give the same outputs on CUDA as on CPU, eager and as exported TorchScript
(traced on the CPU, loaded onto the GPU)."""

import pytest
import torch
from ppdist_testing import tiny_config, tiny_seg_config

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.export.deploy_modules import build_deploy
from ppdist.export.graph_export import example_inputs, export_torchscript
from ppdist.modeling.deploy import convert_to_deploy

MAKERS = {"rec": tiny_config, "seg": tiny_seg_config}


@pytest.mark.parametrize("task", sorted(MAKERS))
def test_export_parity_on_cuda(tmp_path, task):
    cfg = MAKERS[task](str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    config = load_config(cfg, ["Global.synthetic_data=null"])
    torch.manual_seed(0)
    model = convert_to_deploy(build_model(config).eval())
    module, spec = build_deploy(model, config)
    inputs = example_inputs(spec, spec.example_shapes[0], seed=3)
    with torch.no_grad():
        want = module(*inputs)
    path = str(tmp_path / "model.pt")
    export_torchscript(module, spec, path)  # traced on the CPU, as tools/export_model.py does
    scripted = torch.jit.load(path, map_location="cuda")
    module.cuda()
    with torch.no_grad():
        eager, traced = module(*[x.cuda() for x in inputs]), scripted(*[x.cuda() for x in inputs])
    want, eager, traced = ((t,) if isinstance(t, torch.Tensor) else t for t in (want, eager, traced))
    for a, b, c in zip(want, eager, traced):
        assert torch.allclose(a.float(), b.float().cpu(), atol=1e-3, rtol=1e-3)
        assert torch.allclose(b.float(), c.float(), atol=1e-4, rtol=1e-4)
