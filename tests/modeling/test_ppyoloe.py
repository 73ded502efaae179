"""PP-YOLOE: exact parameter counts of the originals, head contracts, RepVgg deploy, L2 tags."""

import copy
import math

import pytest
import torch

import ppdist.modeling  # noqa: F401  (registers the components)
from ppdist.modeling.architectures import BaseModel
from ppdist.modeling.backbones.cspresnet import RepVggBlock
from ppdist.modeling.deploy import convert_to_deploy
from ppdist.modeling.heads.ppyoloe import PPYOLOEHead, distance2bbox, generate_anchors

SCALES = {"s": (0.50, 0.33), "m": (0.75, 0.67), "l": (1.0, 1.0), "x": (1.25, 1.33)}
# verified_numbers.md: PaddleDetection release/2.7.1 with paddlepaddle 2.6.2, 80 classes
REFERENCE = {
    "s": (8_084_588, 7_926_260),
    "m": (24_134_892, 23_427_492),
    "l": (54_078_556, 52_198_924),
    "x": (102_331_484, 98_424_044),
}
H, W = 256, 320
STRIDES = (32, 16, 8)
A = sum((H // s) * (W // s) for s in STRIDES)


def build(scale: str = "s", use_alpha: bool = False, num_classes: int = 80) -> BaseModel:
    w, d = SCALES[scale]
    return BaseModel(
        {
            "model_type": "det",
            "algorithm": "PPYOLOE",
            "Backbone": {
                "name": "CSPResNet",
                "layers": [3, 6, 6, 3],
                "channels": [64, 128, 256, 512, 1024],
                "return_idx": [1, 2, 3],
                "use_large_stem": True,
                "width_mult": w,
                "depth_mult": d,
                "use_alpha": use_alpha,
            },
            "Neck": {
                "name": "CustomCSPPAN",
                "out_channels": [768, 384, 192],
                "stage_num": 1,
                "block_num": 3,
                "act": "swish",
                "spp": True,
                "width_mult": w,
                "depth_mult": d,
            },
            "Head": {"name": "PPYOLOEHead", "num_classes": num_classes, "fpn_strides": list(STRIDES)},
        }
    )


def trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.fixture(scope="module")
def model_s() -> BaseModel:
    torch.manual_seed(0)
    return build("s")


@pytest.mark.parametrize("scale", list(SCALES))
def test_parameter_counts_match_original(scale):
    model = build(scale)
    train_ref, deploy_ref = REFERENCE[scale]
    assert trainable(model) == train_ref
    assert trainable(convert_to_deploy(model)) == deploy_ref


def test_scaled_widths(model_s):
    assert model_s.backbone.out_channels == [128, 256, 512]
    assert model_s.backbone.strides == [8, 16, 32]
    assert model_s.neck.out_channels == [384, 192, 96]
    assert model_s.out_channels == 80


def test_train_outputs(model_s):
    model_s.train()
    out = model_s(torch.randn(2, 3, H, W))
    assert out["cls_logits"].shape == (2, A, 80)
    assert out["reg_distri"].shape == (2, A, 68)
    assert out["num_anchors_list"] == [(H // s) * (W // s) for s in STRIDES]
    assert out["anchors"].shape == (A, 4) and out["anchor_points"].shape == (A, 2)
    assert out["stride_tensor"].shape == (A, 1)
    # first level is stride 32: centre (16, 16), a 5 * 32 square around it
    assert out["anchor_points"][0].tolist() == [16.0, 16.0]
    assert out["anchors"][0].tolist() == [-64.0, -64.0, 96.0, 96.0]
    assert out["anchor_points"][W // 32].tolist() == [16.0, 48.0]  # row-major: next row
    assert out["stride_tensor"][-1].item() == 8.0
    assert out["anchor_points"][-1].tolist() == [W - 4.0, H - 4.0]
    # bias init: logits -log(99), reg bins all 1.0 (zero weights)
    assert torch.allclose(out["cls_logits"], torch.full_like(out["cls_logits"], -math.log(99)))
    assert torch.allclose(out["reg_distri"], torch.ones_like(out["reg_distri"]))
    out["cls_logits"].sum().backward()


def test_eval_outputs_and_initial_decode(model_s):
    model_s.eval()
    with torch.no_grad():
        out = model_s({"image": torch.randn(1, 3, H, W)})
    assert set(out) == {"scores", "boxes"}
    assert out["scores"].shape == (1, 80, A) and out["boxes"].shape == (1, A, 4)
    assert torch.allclose(out["scores"], torch.full_like(out["scores"], 0.01), atol=1e-6)
    # uniform bins -> expected distance 8 strides on every side
    _, points, _, strides = generate_anchors([(H // s, W // s) for s in STRIDES], STRIDES)
    expected = distance2bbox(points, torch.full((A, 4), 8.0) * strides)
    assert torch.allclose(out["boxes"][0], expected, atol=1e-3)


def test_any_input_size_in_eval():
    torch.manual_seed(0)
    model = build("s", num_classes=3).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 250, 330))
    sizes = [(8, 11), (16, 21), (32, 42)]  # ceil-halved five times
    count = sum(h * w for h, w in sizes)
    assert out["scores"].shape == (1, 3, count) and out["boxes"].shape == (1, count, 4)


def _randomise(model: BaseModel) -> None:
    """Non-trivial BN statistics/affines and prediction weights, so outputs depend on the input."""
    torch.manual_seed(1)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(2, 3, 128, 96))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            if isinstance(m, RepVggBlock) and m.alpha is not None:
                m.alpha.fill_(0.6)
        for conv in list(model.head.pred_cls) + list(model.head.pred_reg):
            conv.weight.normal_(0.0, 0.05)
            conv.bias.zero_()


@pytest.mark.parametrize("use_alpha", [False, True])
def test_repvgg_deploy_keeps_eval_outputs(use_alpha):
    torch.manual_seed(0)
    model = build("s", use_alpha=use_alpha, num_classes=4)
    blocks = [m for m in model.backbone.modules() if isinstance(m, RepVggBlock)]  # neck: no alpha
    assert trainable(model) == REFERENCE["s"][0] - 76 * (9 * (384 + 192 + 96) + 3) + use_alpha * len(blocks)
    _randomise(model)
    model.double().eval()  # float64: the comparison measures the folding, not float32 rounding
    x = torch.randn(2, 3, H, W, dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        deployed = convert_to_deploy(copy.deepcopy(model))
        after = deployed(x)
    assert all(
        b.conv is not None and not hasattr(b, "conv1")
        for b in deployed.modules()
        if isinstance(b, RepVggBlock)
    )
    assert before["scores"].std() > 1e-2  # not trivially constant
    assert before["boxes"].dtype == torch.float64
    assert (before["scores"] - after["scores"]).abs().max() < 1e-4
    assert (before["boxes"] - after["boxes"]).abs().max() < 1e-4


def test_norm_params_exempt_from_l2(model_s):
    for model in (model_s, copy.deepcopy(model_s)):
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                assert module.weight.regularizer_factor == 0.0
                assert module.bias.regularizer_factor == 0.0
            elif isinstance(module, torch.nn.Conv2d):
                assert not hasattr(module.weight, "regularizer_factor")
    assert "proj" not in dict(model_s.named_parameters())
    assert model_s.head.proj.tolist() == list(range(17))


def test_neck_reads_checkpoints_with_the_positional_spp_names():
    """Before the SPP was named ``spp`` (as in PaddleDetection) ppdist stored it at ``convs.<(n-1)//2 + 1>``
    with later blocks shifted: such checkpoints still load, through load_state_dict and pretrained loading."""
    import torch

    from ppdist.engine.checkpoint import load_matching_weights
    from ppdist.modeling.necks.custom_csp_pan import CSPStage

    torch.manual_seed(0)
    stage = CSPStage(8, 8, n=3, spp=True)
    assert list(stage.convs._modules) == ["0", "1", "spp", "2"]
    position = {"0": "0", "1": "1", "spp": "2", "2": "3"}
    legacy = {}
    for key, value in stage.state_dict().items():
        if key.startswith("convs."):
            name, rest = key[len("convs.") :].split(".", 1)
            key = f"convs.{position[name]}.{rest}"
        legacy[key] = value
    strict = CSPStage(8, 8, n=3, spp=True)
    strict.load_state_dict(legacy)
    matched = CSPStage(8, 8, n=3, spp=True)
    _, mismatched, missing = load_matching_weights(matched, dict(legacy), "legacy")
    assert not mismatched and not missing
    for model in (strict, matched):
        for key, value in stage.state_dict().items():
            assert torch.equal(model.state_dict()[key], value), key


def test_eval_scores_and_boxes_are_fp32_under_autocast():
    torch.manual_seed(0)
    model = build("s", num_classes=3).eval()
    for layer in model.head.pred_cls:  # spread the scores: fp16/bf16 sigmoids would tie
        torch.nn.init.normal_(layer.weight, std=0.05)
        torch.nn.init.normal_(layer.bias, std=1.0)
    image = torch.randn(1, 3, 96, 96)
    logits = []
    hooks = [
        layer.register_forward_hook(lambda m, a, out: logits.append(out)) for layer in model.head.pred_cls
    ]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(image)
    for hook in hooks:
        hook.remove()
    assert logits[0].dtype == torch.bfloat16  # the convolutions did run in bf16
    assert out["scores"].dtype == torch.float32 and out["boxes"].dtype == torch.float32
    expected = torch.cat([logit.flatten(2) for logit in logits], dim=2).float().sigmoid()
    assert torch.equal(out["scores"], expected)  # the sigmoid itself in fp32, not rounded to bf16


def test_anchors_are_fp32_under_bf16_autocast_past_1024_px():
    """At 1088 px bf16 (8 bits of mantissa) would move anchor points by 4 px: the anchors of the
    training outputs and the points the eval boxes are decoded from stay exact float32."""
    size = 1088
    shapes = [(size // s, size // s) for s in STRIDES]
    anchors, points, counts, strides = generate_anchors(shapes, STRIDES)
    assert not torch.equal(points.bfloat16().float(), points)  # bf16 anchors would be wrong here
    torch.manual_seed(0)
    feats = [torch.randn(1, 4, h, w).bfloat16() for h, w in shapes]
    head = PPYOLOEHead([4, 4, 4], num_classes=2, fpn_strides=STRIDES)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(feats)
    for key, want in (("anchors", anchors), ("anchor_points", points), ("stride_tensor", strides)):
        assert out[key].dtype == torch.float32 and torch.equal(out[key], want), key
    assert out["num_anchors_list"] == counts
    head = PPYOLOEHead([4, 4, 4], num_classes=2, fpn_strides=STRIDES).eval()  # a fresh anchor cache
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        boxes = head(feats)["boxes"][0]
    # initial regression: uniform bins, an expected distance of 8 strides on every side
    expected = distance2bbox(points, torch.full((points.shape[0], 4), 8.0) * strides)
    assert boxes.dtype == torch.float32 and (boxes - expected).abs().max() < 1e-3
