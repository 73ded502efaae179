"""PP-OCRv3's losses equal PaddleOCR's (tests/fixtures/paddle_ppocrv3/make_loss_fixture.py): every term
and the total of the distillation recipe's CombinedLoss and of ch_PP-OCRv3_rec.yml's MultiLoss, their
gradients w.r.t. the predictions, and the other modes of DMLLoss / DistanceLoss."""

import copy
import logging
import os

import numpy as np
import pytest
import torch
import yaml

from ppdist.components import build_loss, build_metric, build_postprocess
from ppdist.config import load_config
from ppdist.errors import ConfigError
from ppdist.losses import (
    CombinedLoss,
    DistanceLoss,
    DistillationCTCLoss,
    DistillationDMLLoss,
    DMLLoss,
    MultiLoss,
    SARLoss,
)
from ppdist.utils.host_sync import HostSyncCounter

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_ppocrv3")
DICT = os.path.join(FIXTURES, "loss_dict.txt")
TOL = 1e-5

# the Loss section of PaddleOCR's configs/rec/PP-OCRv3/ch_PP-OCRv3_rec_distillation.yml
PAIR = [["Student", "Teacher"]]
DISTILLATION_LOSS = [
    {"DistillationDMLLoss": dict(weight=1.0, act="softmax", use_log=True, model_name_pairs=PAIR, key="head_out",
                                 multi_head=True, dis_head="ctc", name="dml_ctc")},
    {"DistillationDMLLoss": dict(weight=0.5, act="softmax", use_log=True, model_name_pairs=PAIR, key="head_out",
                                 multi_head=True, dis_head="sar", name="dml_sar")},
    {"DistillationDistanceLoss": dict(weight=1.0, mode="l2", model_name_pairs=PAIR, key="backbone_out")},
    {"DistillationCTCLoss": dict(weight=1.0, model_name_list=["Student", "Teacher"], key="head_out", multi_head=True)},
    {"DistillationSARLoss": dict(weight=1.0, model_name_list=["Student", "Teacher"], key="head_out", multi_head=True)},
]  # fmt: skip


@pytest.fixture(scope="module")
def fixture():
    with np.load(os.path.join(FIXTURES, "loss_fixture.npz")) as data:
        return dict(data)


def nest(fixture, prefix):
    """The arrays under ``prefix/`` as a nested dict of float tensors that require gradients."""
    tree = {}
    for name, value in fixture.items():
        if name.startswith(prefix + "/"):
            *path, leaf = name[len(prefix) + 1 :].split("/")
            node = tree
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = torch.tensor(value, requires_grad=True)
    return tree


def flat(tree, prefix):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}/{key}").items()}
    return {prefix: tree}


def batch_of(fixture):
    batch = {
        k: torch.from_numpy(fixture[f"batch/{k}"])
        for k in ("label_ctc", "label_sar", "length", "valid_ratio")
    }
    batch["image"] = torch.zeros(3, 3, 4, 4)
    return batch


def assert_terms(terms, fixture, prefix):
    expected = {k[len(prefix) + 1 :]: v for k, v in fixture.items() if k.startswith(prefix + "/")}
    assert sorted(terms) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(terms[name].detach().numpy(), value, rtol=TOL, atol=TOL, err_msg=name)


def assert_grads(tree, fixture, prefix, grad_prefix):
    expected = {
        k.replace(grad_prefix, prefix, 1): v for k, v in fixture.items() if k.startswith(grad_prefix + "/")
    }
    got = {k: v.grad for k, v in flat(tree, prefix).items()}
    assert sorted(k for k, g in got.items() if g is not None and g.abs().sum() > 0) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name].numpy(), value, rtol=TOL, atol=TOL, err_msg=name)


def test_combined_distillation_loss_equals_paddle(fixture):
    loss = CombinedLoss(copy.deepcopy(DISTILLATION_LOSS), character_dict_path=DICT, use_space_char=True)
    assert loss.parts[-1].sar.ignore_index == 13  # n + 1 with n = 10 characters + space + blank
    assert loss.host_keys == ("length",)
    preds = nest(fixture, "train")
    terms = loss(preds, batch_of(fixture))
    assert_terms(terms, fixture, "combined")
    assert list(terms)[0] == "loss" and "dml_ctc_0" in terms and "loss_ctc_Teacher_1" in terms
    terms["loss"].backward()
    assert_grads(preds, fixture, "train", "combined_grad")


@pytest.mark.parametrize("tag, weights", [("multi", {}), ("multi_w", {"weight_1": 0.7, "weight_2": 0.3})])
def test_multi_loss_equals_paddle(fixture, tag, weights):
    loss = MultiLoss(
        [{"CTCLoss": None}, {"SARLoss": None}], character_dict_path=DICT, use_space_char=True, **weights
    )
    assert loss.sar.ignore_index == 13 and loss.host_keys == ("length",)
    heads = nest(fixture, "train")["Student"]["head_out"]
    terms = loss(heads, batch_of(fixture))
    assert_terms(terms, fixture, tag)
    if tag == "multi":
        terms["loss"].backward()
        assert_grads(heads, fixture, "train/Student/head_out", "multi_grad")


def test_other_modes_of_the_pair_losses_equal_paddle(fixture):
    s = {k: torch.from_numpy(v) for k, v in fixture.items() if k.startswith("train/Student/")}
    t = {
        k.replace("Teacher", "Student"): torch.from_numpy(v)
        for k, v in fixture.items()
        if k.startswith("train/Teacher/")
    }
    ctc, sar, backbone = (
        "train/Student/head_out/ctc",
        "train/Student/head_out/sar",
        "train/Student/backbone_out",
    )
    got = {
        "dml_softmax_nolog": DMLLoss(act="softmax")(s[ctc], t[ctc]),
        "dml_sigmoid_log": DMLLoss(act="sigmoid", use_log=True)(s[sar], t[sar]),
        "distance_l1": DistanceLoss(mode="l1")(s[backbone], t[backbone]),
        "distance_smooth_l1": DistanceLoss(mode="smooth_l1")(s[backbone], 0.3 * t[backbone]),
    }
    assert got["dml_softmax_nolog"].shape == (3,)  # Paddle's KL/JS form: one value per sample
    assert_terms(got, fixture, "extra")


def test_sar_loss_ignores_padding_and_shifts_the_label():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6)
    labels = torch.tensor([[4, 1, 2, 4], [4, 3, 4, 5]])  # start 4, end 4, padding 5
    got = SARLoss(ignore_index=5)(logits, {"label": labels})["loss"]
    scored = [(0, 0, 1), (0, 1, 2), (0, 2, 4), (1, 0, 3), (1, 1, 4)]  # (sample, step, target)
    expected = -sum(torch.log_softmax(logits[b, s], 0)[c] for b, s, c in scored) / len(scored)
    assert torch.allclose(got, expected)


def test_distillation_terms_are_named_per_model_and_pair():
    torch.manual_seed(1)
    preds = {m: {"head_out": torch.randn(2, 5, 4)} for m in ("A", "B", "C")}
    dml = DistillationDMLLoss(
        model_name_pairs=[["A", "B"], ["A", "C"]], act="softmax", use_log=True, key="head_out"
    )
    terms = dml(preds, None)
    assert list(terms) == ["dml_0", "dml_1", "loss"]
    assert torch.allclose(terms["loss"], terms["dml_0"] + terms["dml_1"])
    assert torch.allclose(
        terms["dml_1"], DMLLoss(act="softmax", use_log=True)(preds["A"]["head_out"], preds["C"]["head_out"])
    )
    batch = {"label": torch.tensor([[1, 2], [3, 0]]), "length": torch.tensor([2, 1])}
    ctc = DistillationCTCLoss(model_name_list=["B", "C"], key="head_out")(preds, batch)
    assert list(ctc) == ["loss_ctc_B_0", "loss_ctc_C_1"]


def test_losses_read_no_device_value_on_the_host(fixture):
    loss = CombinedLoss(copy.deepcopy(DISTILLATION_LOSS), character_dict_path=DICT, use_space_char=True)
    preds, batch = nest(fixture, "train"), batch_of(fixture)
    with HostSyncCounter(host=[batch["length"]]) as counter:  # the loss's host_keys stay on the host
        loss(preds, batch)["loss"].backward()
    assert counter.count == 0, counter.report()


def test_config_mistakes_are_one_clear_error(caplog):
    entries = copy.deepcopy(DISTILLATION_LOSS)
    del entries[2]["DistillationDistanceLoss"]["weight"]
    with pytest.raises(
        ConfigError, match=r"loss_config_list\[2\]\.DistillationDistanceLoss\.weight is required"
    ):
        CombinedLoss(entries)
    with pytest.raises(ConfigError, match=r"loss_config_list\[0\] must be a one-key mapping"):
        CombinedLoss([{"DistillationCTCLoss": {"weight": 1.0}, "DistillationSARLoss": {"weight": 1.0}}])
    with pytest.raises(
        ConfigError, match=r"unknown key .*loss_config_list\[0\]\.DistillationDMLLoss\.dis_heads"
    ):
        CombinedLoss([{"DistillationDMLLoss": {"weight": 1.0, "model_name_pairs": PAIR, "dis_heads": "ctc"}}])
    with pytest.raises(ConfigError, match=r"dis_head must be one of \('ctc', 'sar'\)"):
        CombinedLoss(
            [
                {
                    "DistillationDMLLoss": {
                        "weight": 1.0,
                        "model_name_pairs": PAIR,
                        "multi_head": True,
                        "dis_head": "nrtr",
                    }
                }
            ]
        )
    with pytest.raises(
        ConfigError, match=r"loss_config_list\[1\]\.NRTRLoss: MultiLoss supports CTCLoss, SARLoss \(NRTRLoss"
    ):
        MultiLoss([{"CTCLoss": None}, {"NRTRLoss": None}])
    with caplog.at_level(logging.WARNING, logger="ppdist"):
        entries = [DISTILLATION_LOSS[4], DISTILLATION_LOSS[3]]
        loss = CombinedLoss(copy.deepcopy(entries), character_dict_path=DICT, use_space_char=True)
    assert loss.parts[0].sar.ignore_index == 92  # not the last entry: Paddle's default, and a warning
    assert "loss_config_list[0].DistillationSARLoss: ignore_index is not set" in caplog.text
    with pytest.raises(TypeError, match="DMLLoss compares two outputs; as a Loss use DistillationDMLLoss"):
        DMLLoss()(torch.zeros(1, 2, 3), {"label": torch.zeros(1)})


def distillation_config(tmp_path, repo_root, loss_entries):
    """configs/rec/rec_mv3_none_bilstm_ctc.yml with the distillation recipe's Loss, PostProcess and
    Metric sections (their keys are validated whatever the Architecture) and the fixture's dictionary."""
    with open(os.path.join(repo_root, "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")) as handle:
        config = yaml.safe_load(handle)
    config["Global"].update(character_dict_path=DICT, use_space_char=True)
    config["Loss"] = {"name": "CombinedLoss", "loss_config_list": loss_entries}
    config["PostProcess"] = {"name": "DistillationCTCLabelDecode", "model_name": ["Student", "Teacher"],
                             "key": "head_out", "multi_head": True}  # fmt: skip
    config["Metric"] = {"name": "DistillationMetric", "base_metric_name": "RecMetric", "main_indicator": "acc",
                        "key": "Student", "ignore_space": False}  # fmt: skip
    path = tmp_path / "distillation.yml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_the_recipe_sections_validate_and_build_with_the_global_dictionary(tmp_path, repo_root, fixture):
    config = load_config(distillation_config(tmp_path, repo_root, copy.deepcopy(DISTILLATION_LOSS)))
    loss = build_loss(config)
    assert loss.parts[-1].sar.ignore_index == 13  # n + 1 from Global.character_dict_path + use_space_char
    assert build_postprocess(config).num_classes == 12
    assert build_metric(config).main_indicator == "acc"
    assert_terms(loss(nest(fixture, "train"), batch_of(fixture)), fixture, "combined")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda e: e[2]["DistillationDistanceLoss"].pop("weight"),
         r"Loss\.loss_config_list\[2\]\.DistillationDistanceLoss\.weight is required by CombinedLoss"),
        (lambda e: e[0]["DistillationDMLLoss"].update(dis_heads="ctc"),
         r"unknown key Loss\.loss_config_list\[0\]\.DistillationDMLLoss\.dis_heads .*Did you mean: 'dis_head'"),
        (lambda e: e.append({"DistilationCTCLoss": {"weight": 1.0}}),
         r"unknown loss name 'DistilationCTCLoss' at Loss\.loss_config_list\[5\].*'DistillationCTCLoss'"),
        (lambda e: e.append({"DistillationCTCLoss": 1.0}),
         r"Loss\.loss_config_list\[5\]\.DistillationCTCLoss parameters must be a mapping"),
    ],
)  # fmt: skip
def test_loss_list_mistakes_fail_validation_with_the_entry_path(tmp_path, repo_root, edit, message):
    entries = copy.deepcopy(DISTILLATION_LOSS)
    edit(entries)
    with pytest.raises(ConfigError, match=message):
        load_config(distillation_config(tmp_path, repo_root, entries))
