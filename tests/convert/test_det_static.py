"""PaddleDetection's static-era format (release/2.2 ``static/configs/faster_rcnn_r50_fpn_1x.yml``, the
Fleet-era guide's config) translates to the same model and schedule in PaddleDetection 2.x's format,
with the static classes' defaults; a key without a translation is refused in one line naming it."""

from __future__ import annotations

import json
import os

import pytest

from ppdist.components import build_model
from ppdist.convert.configs.common import Keys, Report, read_paddle_yaml
from ppdist.convert.configs.det_schedule import convert_det_optimizer
from ppdist.convert.configs.det_static import is_static_det, translate_static
from ppdist.convert.configs.paddledetection import convert_det
from ppdist.errors import ConfigError
from ppdist.optim import build_lr_schedule

STATIC = os.path.join(
    os.path.dirname(__file__), "..", "fixtures", "paddle_configs", "PaddleDetection", "static", "configs"
)
SEED = os.path.join(STATIC, "faster_rcnn_r50_fpn_1x.yml")
with open(os.path.join(os.path.dirname(__file__), "..", "fixtures", "faster_rcnn", "param_counts.json")) as f:
    COUNTS = json.load(f)


def translated(path: str = SEED, **changes):
    data = read_paddle_yaml(path)
    data.update(changes)
    return translate_static(data, path)


def test_the_seed_config_is_recognised_and_translated_to_the_2x_model():
    assert is_static_det(read_paddle_yaml(SEED))
    out, left = translated()
    assert out["architecture"] == "FasterRCNN" and out["num_classes"] == 80  # 81 counted the background
    assert out["FasterRCNN"] == {
        "backbone": "ResNet",
        "neck": "FPN",
        "rpn_head": "RPNHead",
        "bbox_head": "BBoxHead",
        "bbox_post_process": "BBoxPostProcess",
    }
    # static freeze_at 2 = res2 and the stem = 2.x's freeze_at 0; feature_maps [2..5] = return_idx [0..3]
    assert out["ResNet"] == {
        "depth": 50,
        "variant": "b",
        "norm_type": "bn",
        "freeze_norm": True,
        "norm_decay": 0.0,
        "freeze_at": 0,
        "return_idx": [0, 1, 2, 3],
        "num_stages": 4,
    }
    assert out["FPN"] == {
        "out_channel": 256,
        "spatial_scales": [0.25, 0.125, 0.0625, 0.03125],
        "has_extra_convs": False,
        "extra_stage": 1,
        "use_c5": True,
    }
    rpn = out["RPNHead"]
    assert rpn["anchor_generator"] == {
        "aspect_ratios": [0.5, 1.0, 2.0],
        "anchor_sizes": [[32.0], [64.0], [128.0], [256.0], [512.0]],
        "strides": [4, 8, 16, 32, 64],
    }
    assert rpn["rpn_target_assign"] == {
        "batch_size_per_im": 256,
        "fg_fraction": 0.5,
        "positive_overlap": 0.7,
        "negative_overlap": 0.3,
        "use_random": True,
    }
    # static FPN proposals: post_nms_top_n per level, then the image's best post_nms_top_n
    assert rpn["train_proposal"] == {
        "min_size": 0.0,
        "nms_thresh": 0.7,
        "pre_nms_top_n": 2000,
        "post_nms_top_n": 2000,
        "topk_after_collect": True,
    }
    assert rpn["test_proposal"]["post_nms_top_n"] == 1000 and rpn["test_proposal"]["topk_after_collect"]
    assert out["BBoxHead"] == {
        "head": "TwoFCHead",
        "roi_extractor": {
            "resolution": 7,
            "sampling_ratio": 2,
            "aligned": False,  # the static roi_align has no half-pixel offset
            "canconical_level": 4,
            "canonical_size": 224,
            "start_level": 0,
            "end_level": 3,
        },
        "bbox_assigner": "BBoxAssigner",
        "bbox_weight": [10.0, 10.0, 5.0, 5.0],  # 1 / bbox_reg_weights [0.1, 0.1, 0.2, 0.2]
    }
    assert out["BBoxAssigner"] == {
        "batch_size_per_im": 512,
        "fg_fraction": 0.25,
        "fg_thresh": 0.5,
        "bg_thresh": 0.5,
        "use_random": True,
    }
    assert out["TwoFCHead"] == {"out_channel": 1024}
    assert out["BBoxPostProcess"]["nms"] == {
        "name": "MultiClassNMS",
        "keep_top_k": 100,
        "score_threshold": 0.05,
        "nms_threshold": 0.5,
        "nms_top_k": -1,
    }
    assert out["BBoxPostProcess"]["decode"] == {"name": "RCNNBox", "prior_box_var": [10.0, 10.0, 5.0, 5.0]}
    assert [item.split(" ")[0] for item in left] == [
        "FPNRPNHead.rpn_target_assign.rpn_straddle_thresh",
        "BBoxHead.bbox_loss",
    ]


def test_the_readers_come_from_the_reader_file_with_the_configs_batch_size():
    out, _ = translated()
    train = out["TrainReader"]
    assert train["batch_size"] == 2  # the config's TrainReader over faster_fpn_reader.yml's 1
    assert train["sample_transforms"] == [
        {"Decode": {}},
        {"RandomFlip": {"prob": 0.5}},
        {"NormalizeImage": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "is_scale": True}},
        {"Resize": {"target_size": [800, 1333], "keep_ratio": True, "interp": 1}},
        {"Permute": {}},
    ]
    assert train["batch_transforms"] == [{"PadBatch": {"pad_to_stride": 32}}]
    assert out["TrainDataset"]["name"] == "COCODataSet" and out["TrainDataset"]["image_dir"] == "train2017"
    assert out["EvalReader"]["batch_size"] == 1 and out["EvalDataset"]["anno_path"].endswith("val2017.json")


def test_the_schedule_is_the_seeds_iterations_momentum_l2_and_a_1000_step_warmup():
    out, _ = translated()
    assert out["max_iters"] == 90000 and out["snapshot_iter"] == 10000
    report = Report()
    optimizer = convert_det_optimizer(Keys(out, "", report), report, SEED)
    assert optimizer["name"] == "Momentum" and optimizer["momentum"] == 0.9
    assert optimizer["regularizer"] == {"name": "L2", "factor": 0.0001}
    lr = optimizer["lr"]
    assert lr["decay_iters"] == [60000, 80000] and lr["warmup_iters"] == 1000
    assert lr["warmup_start_lr"] == pytest.approx(0.002)
    schedule = build_lr_schedule(lr, epochs=0, step_each_epoch=7330, total_steps=90000)
    assert schedule.lr_at(0) == pytest.approx(0.002) and schedule.lr_at(1000) == 0.02
    assert schedule.lr_at(59999) == 0.02 and schedule.lr_at(60000) == pytest.approx(0.002)
    assert schedule.lr_at(80000) == pytest.approx(0.0002)
    assert out["pretrain_weights"].endswith("ResNet50_cos_pretrained.pdparams")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"architecture": "MaskRCNN"}, "architecture 'MaskRCNN' of a static-era config"),
        ({"ResNet": {"depth": 50, "dcn_v2_stages": [3, 4, 5]}}, "ResNet.dcn_v2_stages"),
        ({"ResNet": {"depth": 50, "frozen": True}}, r"ResNet.frozen \(static-era key\) has no translation"),
        ({"FPN": {"num_chan": 256, "upsample": "nearest"}}, r"FPN.upsample \(static-era key\)"),
        ({"mystery_key": 1}, r"\(top level\).mystery_key \(static-era key\)"),
        ({"BBoxAssigner": {"bg_thresh_lo": 0.1}}, "BBoxAssigner.bg_thresh_lo 0.1"),
        ({"_READER_": "missing_reader.yml"}, "_READER_ file not found: missing_reader.yml"),
    ],
)
def test_a_key_without_translation_is_refused_naming_it(changes, message):
    with pytest.raises(ConfigError, match=message):
        translated(**changes)


RELEASE_R50_FPN = os.path.join(
    os.path.dirname(__file__),
    "..",
    "fixtures",
    "paddle_configs",
    "PaddleDetection",
    "configs",
    "faster_rcnn",
    "faster_rcnn_r50_fpn_1x_coco.yml",
)


def flat(tree, prefix=""):
    """``{dotted key: leaf}`` of nested mappings."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else key))
    return out


def test_the_seed_config_converts_to_release_2_7_1s_model_and_the_same_parameters():
    """Converted end to end, the static config's model sections are release/2.7.1's
    faster_rcnn_r50_fpn_1x_coco.yml's except for values the static config (or its classes'
    defaults) sets otherwise, each listed here; both build a model of 41,477,536 trainable
    parameters (the count PaddleDetection gives the 2.x config, tests/fixtures/faster_rcnn)."""
    static = convert_det(SEED).config
    release = convert_det(RELEASE_R50_FPN).config
    differ = {
        key
        for section in ("Architecture", "PostProcess")
        for key in set(flat(static[section], section)) | set(flat(release[section], section))
        if flat(static[section], section).get(key) != flat(release[section], section).get(key)
    }
    assert differ == {
        # written out from the static classes' defaults (2.x leaves them to its own, equal ones)
        "Architecture.Backbone.freeze_norm",
        "Architecture.Backbone.norm_decay",
        "Architecture.Backbone.variant",
        "Architecture.Neck.extra_stage",
        "Architecture.Neck.has_extra_convs",
        "Architecture.Neck.use_c5",
        "Architecture.Head.bbox_head.bbox_weight",
        "Architecture.Head.bbox_head.roi_extractor.canconical_level",
        "Architecture.Head.bbox_head.roi_extractor.canonical_size",
        "Architecture.Head.bbox_head.roi_extractor.start_level",
        "Architecture.Head.bbox_head.roi_extractor.end_level",
        "PostProcess.decode.prior_box_var",
        "PostProcess.nms.nms_top_k",
        # the static model's own values
        "Architecture.Head.bbox_head.roi_extractor.aligned",  # False; 2.7.1 ignores True anyway
        "Architecture.Head.bbox_head.roi_extractor.sampling_ratio",  # 2 (2.x: 0, adaptive)
        "Architecture.Head.rpn_head.train_proposal.post_nms_top_n",  # 2000 (2.x: 1000)
        "Architecture.Head.rpn_head.test_proposal.topk_after_collect",  # True (2.x: per level)
    }
    config = {"Global": {}, "Architecture": static["Architecture"], "PostProcess": static["PostProcess"]}
    model = build_model(config)
    assert (
        sum(p.numel() for p in model.parameters() if p.requires_grad)
        == COUNTS["faster_rcnn_r50_fpn_1x_coco.yml"]["total"]
    )
