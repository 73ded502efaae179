"""PaddleOCR's PP-OCRv3 recognition configs (copied unchanged under tests/fixtures/paddle_configs)
load through ppdist's loader: their Paddle-only Global keys are accepted (or refused by name), and,
once the PP-OCRv3 components are registered, each whole file validates as it is."""

import copy
import glob
import os

import pytest

import ppdist  # noqa: F401  (registers every component)
from ppdist import load_config
from ppdist.config import load_yaml_with_bases, validate
from ppdist.config.schema import ARCHITECTURE_KEYS
from ppdist.convert.configs import PPDIST, convert_config, detect_suite
from ppdist.errors import ConfigError
from ppdist.registry import BACKBONES, DATASETS, HEADS, LOSSES, METRICS, POSTPROCESSES, TRANSFORMS

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UPSTREAM = os.path.join(
    REPO, "tests", "fixtures", "paddle_configs", "PaddleOCR", "configs", "rec", "PP-OCRv3"
)
DISTILLATION = os.path.join(UPSTREAM, "ch_PP-OCRv3_rec_distillation.yml")
MAIN_CONFIGS = [
    DISTILLATION,
    os.path.join(UPSTREAM, "ch_PP-OCRv3_rec.yml"),
    os.path.join(UPSTREAM, "en_PP-OCRv3_rec.yml"),
]
CONFIGS = MAIN_CONFIGS + sorted(glob.glob(os.path.join(UPSTREAM, "multi_language", "*_PP-OCRv3_rec.yml")))
CRNN = os.path.join(REPO, "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")

# issue 29: the whole-file tests skip while the components they name are not registered (they are
# built in other branches). Remove this switch at merge: a component missing then fails the test.
SKIP_UNTIL_MERGED = True
COMPONENTS = [
    (BACKBONES, "MobileNetV1Enhance"),
    (HEADS, "MultiHead"),
    (HEADS, "SARHead"),
    (LOSSES, "MultiLoss"),
    (LOSSES, "SARLoss"),
    (LOSSES, "CombinedLoss"),
    (LOSSES, "DistillationDMLLoss"),
    (LOSSES, "DistillationDistanceLoss"),
    (LOSSES, "DistillationCTCLoss"),
    (LOSSES, "DistillationSARLoss"),
    (POSTPROCESSES, "DistillationCTCLabelDecode"),
    (METRICS, "DistillationMetric"),
    (TRANSFORMS, "RecConAug"),
    (TRANSFORMS, "RecAug"),
    (TRANSFORMS, "MultiLabelEncode"),
]


def missing_components():
    missing = [f"{registry.kind}:{name}" for registry, name in COMPONENTS if name not in registry]
    if "ext_op_transform_idx" not in DATASETS.accepted_keys("SimpleDataSet")[0]:
        missing.append("SimpleDataSet(ext_op_transform_idx)")
    if "Models" not in ARCHITECTURE_KEYS:
        missing.append("Architecture.Models (DistillationModel)")
    return missing


def needs_components():
    missing = missing_components()
    if missing and SKIP_UNTIL_MERGED:
        pytest.skip(f"PP-OCRv3 components not registered yet (issue 29 merge): {missing}")


def name(path):
    return os.path.relpath(path, UPSTREAM)


def with_crnn_components(path):
    """The upstream file's Global and Optimizer sections on CRNN's model, loss and data."""
    config = copy.deepcopy(load_yaml_with_bases(CRNN))
    upstream = load_yaml_with_bases(path)
    config["Global"] = upstream["Global"]
    config["Optimizer"] = upstream["Optimizer"]
    return config


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_global_and_optimizer_sections_are_accepted_as_written(path):
    config = validate(with_crnn_components(path))
    glob_ = config["Global"]
    assert glob_["debug"] is False and glob_["distributed"] is True  # accepted, no effect
    assert glob_["cal_metric_during_train"] is True and glob_["use_space_char"] is True
    assert glob_["max_text_length"] == 25 and glob_["infer_mode"] is False
    assert glob_["save_res_path"].startswith("./output/rec/predicts_ppocrv3")
    assert glob_["d2s_train_image_shape"] == ([3, 48, -1] if path == DISTILLATION else None)
    lr = config["Optimizer"]["lr"]
    assert (lr["name"], lr["warmup_epoch"]) == (("Piecewise", 5) if path == DISTILLATION else ("Cosine", 5))


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("debug", "yes", r"wrong type for Global\.debug: expected bool or null, got str"),
        ("d2s_train_image_shape", 48, r"wrong type for Global\.d2s_train_image_shape: expected list or null"),
        (
            "to_static",
            True,
            r"Global\.to_static is not supported yet \(Paddle dynamic-to-static.*Global\.compile",
        ),
        ("debugg", False, r"unknown key Global\.debugg\. Did you mean: 'debug'\?"),
    ],
)
def test_paddle_only_global_keys_are_refused_in_one_line(key, value, match):
    config = with_crnn_components(DISTILLATION)
    config["Global"][key] = value
    with pytest.raises(ConfigError, match=match) as info:
        validate(config)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("path", CONFIGS, ids=name)
def test_upstream_file_loads_unchanged(path):
    needs_components()
    assert detect_suite(path) == PPDIST  # PaddleOCR's schema is ppdist's: read as it is
    config = load_config(path)
    assert config["Train"]["dataset"]["ext_op_transform_idx"] == 1
    assert [next(iter(op)) for op in config["Train"]["dataset"]["transforms"]] == [
        "DecodeImage",
        "RecConAug",
        "RecAug",
        "MultiLabelEncode",
        "RecResizeImg",
        "KeepKeys",
    ]
    expected_loss = "CombinedLoss" if path == DISTILLATION else "MultiLoss"
    assert config["Loss"]["name"] == expected_loss


@pytest.mark.parametrize("path", MAIN_CONFIGS, ids=name)
def test_conversion_keeps_every_key(path):
    needs_components()
    assert convert_config(path).unmapped == []
