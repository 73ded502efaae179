"""Config: _BASE_ merging, -o overrides, validation messages, Global injection."""

import os
import textwrap

import pytest
import yaml

from ppdist.config import apply_overrides, load_config, load_yaml_with_bases, merge_dicts, parse_value
from ppdist.errors import ConfigError

REC_CONFIG = "configs/rec/rec_mv3_none_bilstm_ctc.yml"


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(textwrap.dedent(text))
    return str(path)


def test_merge_dicts_child_wins_lists_replace():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    child = {"a": {"y": [3], "z": 2}, "c": 5}
    assert merge_dicts(base, child) == {"a": {"x": 1, "y": [3], "z": 2}, "b": 1, "c": 5}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 1}  # not mutated


def test_parse_value_yaml_and_scientific_floats():
    assert parse_value("[0, 500]") == [0, 500]
    assert parse_value("True") is True
    assert parse_value("1e-5") == pytest.approx(1e-5)
    assert parse_value("0.001") == 0.001
    assert parse_value("./a/b") == "./a/b"


def test_overrides_walk_dicts_and_lists():
    cfg = {"Global": {"a": 1}, "Train": {"dataset": {"transforms": [{"Op": {"k": 1}}]}}}
    apply_overrides(
        cfg, ["Global.a=2", "Global.new.deep=x", "Train.dataset.transforms.0.Op.k=[3, 4]", "Global={b: 3}"]
    )
    assert cfg["Global"] == {"a": 2, "new": {"deep": "x"}, "b": 3}
    assert cfg["Train"]["dataset"]["transforms"][0]["Op"]["k"] == [3, 4]
    with pytest.raises(ConfigError, match="unknown section 'Globl'.*'Global'"):
        apply_overrides(cfg, ["Globl.a=1"])
    with pytest.raises(ConfigError, match="expected Key.sub=value"):
        apply_overrides(cfg, ["Global.a"])
    with pytest.raises(ConfigError, match="list index"):
        apply_overrides(cfg, ["Train.dataset.transforms.7.Op.k=1"])


def test_base_inheritance_relative_paths(tmp_path, repo_root):
    base = os.path.join(repo_root, REC_CONFIG)
    child = write(
        tmp_path / "exp" / "child.yml",
        f"""
        _BASE_: [{base}]
        Global:
          epoch_num: 3
        Train:
          loader:
            num_workers: 0
    """,
    )
    cfg = load_config(child)
    assert cfg["Global"]["epoch_num"] == 3
    assert cfg["Global"]["max_text_length"] == 25  # inherited
    assert cfg["Train"]["loader"]["num_workers"] == 0
    assert cfg["Train"]["loader"]["batch_size_per_card"] == 256  # merged, not replaced
    assert cfg["Train"]["dataset"]["name"] == "LMDBDataSet"


def test_paddle_config_loads_with_defaults(repo_root):
    cfg = load_config(os.path.join(repo_root, REC_CONFIG), ["Global.epoch_num=10"])
    glob = cfg["Global"]
    assert glob["epoch_num"] == 10 and glob["seed"] == 1024 and glob["eval_batch_step"] == [0, 2000]
    assert glob["dist_timeout"] > 0 and glob["max_bad_sample_ratio"] == 0.1


@pytest.mark.parametrize(
    "override,pattern",
    [
        ("Global.epoch_nums=3", r"unknown key Global.epoch_nums.*'epoch_num'"),
        ("Global.epoch_num=three", r"wrong type for Global.epoch_num: expected int or null, got str"),
        (
            "Architecture.Backbone.name=MobileNetV4",
            r"unknown backbone name 'MobileNetV4' at Architecture.Backbone.name.*MobileNetV3",
        ),
        ("Architecture.Backbone.scal=0.5", r"unknown key Architecture.Backbone.scal.*'scale'"),
        ("Loss.name=CTCLos", r"unknown loss name 'CTCLos'.*'CTCLoss'"),
        ("Optimizer.name=Adamm", r"unknown optimizer name 'Adamm'.*'Adam'"),
        ("Optimizer.beta3=0.1", r"unknown key Optimizer.beta3.*'beta1'"),
        ("Optimizer.lr.name=Cosin", r"unknown lr schedule name 'Cosin'.*'Cosine'"),
        (
            "Optimizer.lr.learning_rate=1e39",
            r"Optimizer.lr.learning_rate must be a finite number a float32 holds \(at most 3.403e\+38\), got 1e\+39",
        ),
        ("Optimizer.lr.learning_rate=.nan", r"Optimizer.lr.learning_rate must be a finite number"),
        ("Optimizer.lr=.inf", r"Optimizer.lr must be a finite number a float32 holds"),
        (
            "Train.dataset.transforms.2.RecResizeImg.image_shap=[3,32,100]",
            r"Train.dataset.transforms\[2\].RecResizeImg.image_shap",
        ),
        (
            "Train.dataset.transforms.0={DecodeImg: {img_mode: BGR}}",
            r"unknown transform name 'DecodeImg'.*'DecodeImage'",
        ),
        ("Train.loader.batch_size=3", r"unknown key Train.loader.batch_size.*'batch_size_per_card'"),
        (
            "Train.dataset.label_file_list=[a.txt]",
            r"unknown key Train.dataset.label_file_list.*It is a key of: PubTabDataSet, SimpleDataSet",
        ),
        ("Global.to_static=true", r"Global.to_static is not supported yet"),
        ("Global.eval_batch_step=[1]", r"\[start, interval\]"),
        ("Global.save_iter_step=0", r"Global.save_iter_step must be a positive number of steps"),
        (
            "Global.auto_scale_lr={base_batch_size: 0}",
            r"auto_scale_lr.base_batch_size must be a positive integer",
        ),
        (
            "Global.auto_scale_lr={base_batch: 64}",
            r"unknown key Global.auto_scale_lr.base_batch.*'base_batch_size'",
        ),
        (
            "Global.compile={modes: max-autotune}",
            r"unknown key\(s\) in Global.compile: \['modes'\]; expected some of",
        ),
        ("Global.compile=fast", r"wrong type for Global.compile: expected bool or dict"),
        ("Train.loader.cv2_num_threads=two", r"wrong type for Train.loader.cv2_num_threads: expected int"),
    ],
)
def test_validation_errors_name_file_key_and_suggestion(repo_root, override, pattern):
    path = os.path.join(repo_root, REC_CONFIG)
    with pytest.raises(ConfigError, match=pattern) as err:
        load_config(path, [override])
    assert str(err.value).startswith(path)


def test_unknown_section_and_missing_required(tmp_path, repo_root):
    base = os.path.join(repo_root, REC_CONFIG)
    bad = write(tmp_path / "bad.yml", f"_BASE_: [{base}]\nTrian: {{}}\n")
    with pytest.raises(ConfigError, match=r"bad.yml: unknown section 'Trian'.*'Train'"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"missing required key Train.loader.batch_size_per_card"):
        load_config(base, ["Train.loader.batch_size_per_card=null"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "nope.yml"))
    cyc = write(tmp_path / "cyc.yml", "_BASE_: [cyc.yml]\n")
    with pytest.raises(ConfigError, match="circular"):
        load_config(cyc)


def test_global_keys_reach_transforms_and_postprocess(tmp_path, repo_root):
    from ppdist.components import build_model, build_postprocess
    from ppdist.data.build import build_transforms

    dict_path = write(tmp_path / "dict.txt", "a\nb\nc\n")
    cfg = load_config(
        os.path.join(repo_root, REC_CONFIG),
        [f"Global.character_dict_path={dict_path}", "Global.use_space_char=true", "Global.max_text_length=7"],
    )
    post = build_postprocess(cfg)
    assert post.num_classes == 5  # blank + a b c + space
    ops = build_transforms(cfg["Train"]["dataset"]["transforms"], cfg, "Train.dataset.transforms")
    encoder = ops[1]
    out = encoder({"label": "ab c"})
    assert out["label"].shape == (7,) and int(out["length"]) == 4
    import torch

    model = build_model(cfg).eval()
    assert model(torch.zeros(1, 3, 32, 100)).shape[-1] == 5


def test_dump_config_round_trip(tmp_path, repo_root):
    from ppdist.config import dump_config

    cfg = load_config(os.path.join(repo_root, REC_CONFIG))
    dump_config(cfg, str(tmp_path / "out" / "config.yml"))
    with open(tmp_path / "out" / "config.yml") as handle:
        assert yaml.safe_load(handle) == cfg


@pytest.mark.parametrize(
    "spec,pattern",
    [
        (
            "{kind: ocr, data_dir: d}",
            r"Global.synthetic_data.kind must be one of \['det', 'rec', 'rec_ppocrv3', 'seg', 'table'\], got 'ocr'",
        ),
        ("{kind: rec}", r"missing required key Global.synthetic_data.data_dir"),
        (
            "{kind: rec, data_dir: d, num_trian: 3}",
            r"unknown key Global.synthetic_data.num_trian.*'num_train'",
        ),
        ("{kind: rec, data_dir: d, out_dir: e}", r"unknown key Global.synthetic_data.out_dir"),
    ],
)
def test_synthetic_data_spec_checked_against_the_registered_generators(repo_root, spec, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(os.path.join(repo_root, REC_CONFIG), [f"Global.synthetic_data={spec}"])


def test_load_config_reads_through_the_given_reader(repo_root):
    calls = []

    def read(path):
        calls.append(path)
        return load_yaml_with_bases(os.path.join(repo_root, REC_CONFIG))

    cfg = load_config("virtual.yml", ["Global.epoch_num=2"], read=read)
    assert calls == ["virtual.yml"] and cfg["Global"]["epoch_num"] == 2
    with pytest.raises(ConfigError, match=r"^virtual.yml: unknown section 'Trian'"):
        load_config("virtual.yml", read=lambda path: {"Trian": {}})


@pytest.mark.parametrize(
    "text,overrides,message",
    [
        ("Global: 5\n", [], "Global must be a mapping of keys"),
        ("", ["Global.save_model_dir=[out"], "the value '\\[out' is not valid YAML"),
        ("", ["Global.epoch_num=0"], "Global.epoch_num must be a positive number, got 0"),
        ("", ["Global.max_iters=-3"], "Global.max_iters must be a positive number, got -3"),
        ("", ["Global.max_bad_sample_ratio=1.5"], "max_bad_sample_ratio must lie in \\[0, 1\\]"),
    ],
)
def test_values_out_of_range_or_not_yaml_are_config_errors(tmp_path, text, overrides, message):
    base = os.path.join(os.path.dirname(__file__), "..", "configs", "rec", "quickstart_synth.yml")
    path = tmp_path / "c.yml"
    path.write_text(f"_BASE_: [{os.path.abspath(base)}]\n{text}", encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_config(str(path), overrides)


def test_a_binary_file_as_config_is_named(tmp_path):
    path = tmp_path / "weights.yml"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="is not a text file"):
        load_config(str(path))
