"""PaddleOCR's PP-OCRv3 recognition configs (copied unchanged under tests/fixtures/paddle_configs)
load through ppdist's loader: their Paddle-only Global keys are accepted (or refused by name), and,
once the PP-OCRv3 components are registered, each whole file validates as it is."""

import copy
import glob
import os

import pytest

import ppdist  # noqa: F401  (registers every component)
import ppdist.registry as registry_module
from ppdist import load_config
from ppdist.config import load_yaml_with_bases, validate, validate_synthetic_spec
from ppdist.convert.configs import PPDIST, convert_config, detect_suite
from ppdist.data.synthetic_ppocr import DICT_NAME
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

# the components the whole-file tests need: one missing fails them with its name
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
    architectures = getattr(registry_module, "ARCHITECTURES", None)  # Architecture.name's registry
    if architectures is None or "DistillationModel" not in architectures:
        missing.append("architecture:DistillationModel")
    return missing


def needs_components():
    missing = missing_components()
    assert not missing, f"PP-OCRv3 components not registered: {missing}"


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


# --------------------------------------------------------------------------- ppdist's own recipes
RECIPES = os.path.join(REPO, "configs", "rec", "PP-OCRv3")
BUNDLED = {
    "ppocr/utils/ppocr_keys_v1.txt": "ppdist/data/dicts/ppocr_keys_v1.txt",
    "ppocr/utils/en_dict.txt": "ppdist/data/dicts/en_dict.txt",
}
QUICKSTART = os.path.join(RECIPES, "quickstart_synth.yml")


@pytest.mark.parametrize("path", MAIN_CONFIGS, ids=name)
def test_recipes_are_the_upstream_files_with_ppdist_dictionaries(path):
    upstream = load_yaml_with_bases(path)
    ours = load_yaml_with_bases(os.path.join(RECIPES, os.path.basename(path)))
    upstream["Global"]["character_dict_path"] = BUNDLED[upstream["Global"]["character_dict_path"]]
    assert ours == upstream


def test_quickstart_trains_the_distillation_recipe_on_its_own_dictionary():
    config = load_yaml_with_bases(QUICKSTART)
    recipe = load_yaml_with_bases(os.path.join(RECIPES, "ch_PP-OCRv3_rec_distillation.yml"))
    for section in ("Architecture", "Loss", "PostProcess", "Metric"):
        assert config[section] == recipe[section], section
    glob_, spec = config["Global"], config["Global"]["synthetic_data"]
    assert spec["kind"] == "rec_ppocrv3" and glob_["use_space_char"] is True
    assert os.path.normpath(glob_["character_dict_path"]) == os.path.normpath(
        os.path.join(spec["data_dir"], DICT_NAME)
    )
    for section in ("Train", "Eval"):
        dataset = config[section]["dataset"]
        assert os.path.normpath(dataset["data_dir"]) == os.path.normpath(spec["data_dir"])
        assert dataset["transforms"][2] == {"RecResizeImg": {"image_shape": [3, 48, 320]}}
    validate_synthetic_spec(spec)


@pytest.mark.parametrize(
    "path",
    [os.path.join(RECIPES, os.path.basename(p)) for p in MAIN_CONFIGS] + [QUICKSTART],
    ids=os.path.basename,
)
def test_recipe_loads(path):
    needs_components()
    config = load_config(path)
    if path != QUICKSTART:
        assert os.path.isfile(os.path.join(REPO, config["Global"]["character_dict_path"]))  # bundled
