"""uint8 through the loader, normalisation on the device: which ops a pipeline leaves to the
device, and batches moved with ``move_to_device`` bitwise equal to the host normalisation for the
detection and segmentation recipes' train and eval pipelines."""

import copy
import dataclasses
import pickle

import numpy as np
import pytest
import torch

import ppdist.tasks.det
import ppdist.tasks.seg
import ppdist.tasks.table
from ppdist.benchmark import pipeline_data
from ppdist.config import load_config
from ppdist.data.base import DEVICE_TRANSFORM_KEY
from ppdist.data.build import build_input_pipeline
from ppdist.data.device_transforms import defer_to_device
from ppdist.data.transforms import (
    BatchRandomResize,
    Decode,
    Normalize,
    NormalizeImage,
    PadGT,
    Permute,
    RandomDistort,
    RandomFlip,
)
from ppdist.engine.batch import move_to_device
from ppdist.errors import ConfigError

RECIPES = {
    "det": "configs/det/ppyoloe_crn_s_300e_coco.yml",
    "seg": "configs/seg/pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml",
}


def test_the_trailing_normalisation_is_deferred():
    sample_ops = [Decode(), RandomDistort(), RandomFlip()]
    normalize, permute, pad = NormalizeImage(), Permute(), PadGT()
    batch_ops = [BatchRandomResize(), normalize, permute, pad]
    kept_sample, kept_batch, transform = defer_to_device(sample_ops, batch_ops)
    assert kept_sample == sample_ops and kept_batch == [batch_ops[0], pad]  # PadGT stays, after the resize
    assert transform.sources == ("NormalizeImage", "Permute") and transform.to_chw
    assert [name for name, _ in transform.steps] == ["mul", "sub", "div"]
    # eval: the ops are the dataset's
    kept_sample, kept_batch, transform = defer_to_device([Decode(), normalize, permute], [])
    assert len(kept_sample) == 1 and transform.sources == ("NormalizeImage", "Permute")
    # segmentation: Normalize, the layout change is the dataset's output layout
    _, _, transform = defer_to_device([RandomFlip(), Normalize()], [], layout_in_finish=True)
    assert transform.sources == ("Normalize",) and transform.to_chw
    assert [name for name, _ in transform.steps] == ["div", "sub", "div"]
    # an op without a device form after the normalisation: nothing is deferred
    assert defer_to_device([normalize, permute, RandomFlip()], [])[2] is None
    # a layout change before the normalisation is left on the host (the normalisation with it)
    assert defer_to_device([permute, normalize], [])[2] is None
    assert pickle.loads(pickle.dumps(transform)) == transform  # travels from loader workers


def _batches(config, section, count):
    mode = "train" if section == "Train" else "eval"
    dataset, collate = build_input_pipeline(config, section, mode)
    size = int(config[section]["loader"]["batch_size_per_card"])
    seed = int(config["Global"]["seed"])
    return collate, [
        collate([dataset[(i, 1, seed)] for i in range(start, start + size)])
        for start in range(0, count, size)
    ]


@pytest.fixture(scope="module", params=["det", "seg"])
def recipe(request, tmp_path_factory):
    """A recipe config reading a small synthetic set (its transforms as shipped)."""
    task = request.param
    with pytest.MonkeyPatch.context() as patch:  # small images at the recipes' aspect ratios
        patch.setattr(ppdist.tasks.det, "BENCHMARK_IMAGE_SIZE", (96, 72))
        patch.setattr(ppdist.tasks.seg, "BENCHMARK_IMAGE_SIZE", (128, 64))
        config = load_config(RECIPES[task])
        return task, pipeline_data.with_synthetic_data(config, str(tmp_path_factory.mktemp(task)), 8)


@pytest.mark.parametrize("section", ["Train", "Eval"])
@pytest.mark.parametrize("channels_last", [True, False])
def test_device_normalisation_is_bitwise_the_host_one(recipe, section, channels_last):
    task, config = recipe
    if task == "seg" and section == "Train":  # 128x64 images: crop to fit (the recipe crops 1024x512)
        config = copy.deepcopy(config)
        config["Train"]["dataset"]["transforms"][1] = {"RandomPaddingCrop": {"crop_size": [64, 32]}}
    host_config = copy.deepcopy(config)
    host_config[section]["loader"]["normalize_on_device"] = False
    collate, device_batches = _batches(config, section, 8)
    host_collate, host_batches = _batches(host_config, section, 8)
    assert collate.device_transform is not None and host_collate.device_transform is None
    cpu = torch.device("cpu")
    for on_device, on_host in zip(device_batches, host_batches):
        assert on_device["image"].dtype == torch.uint8 and on_device["image"].shape[-1] == 3  # NHWC
        if task == "seg":  # the label travels as read (uint8), the device makes it int64
            assert on_device["label"].dtype == torch.uint8 and on_host["label"].dtype == torch.int64
        assert DEVICE_TRANSFORM_KEY not in on_host
        moved = move_to_device(on_device, cpu, channels_last)
        expected = move_to_device(on_host, cpu, channels_last)
        assert set(moved) == set(expected)
        image, reference = moved["image"], expected["image"]
        assert image.dtype == torch.float32 and image.shape == reference.shape
        assert torch.equal(image.view(torch.int32), reference.view(torch.int32))  # bitwise
        layout = torch.channels_last if channels_last else torch.contiguous_format
        assert image.is_contiguous(memory_format=layout)
        for key, value in expected.items():
            if key != "image" and isinstance(value, torch.Tensor):
                assert moved[key].dtype == value.dtype and torch.equal(moved[key], value), key


def test_the_switch_is_validated():
    config = load_config(RECIPES["det"], ["Train.loader.normalize_on_device=false"])
    assert config["Train"]["loader"]["normalize_on_device"] is False
    assert config["Eval"]["loader"]["normalize_on_device"] is True  # the default
    with pytest.raises(ConfigError, match="Train.loader.normalize_on_device"):
        load_config(RECIPES["det"], ["Train.loader.normalize_on_device=maybe"])


def test_the_transform_leaves_the_input_alone():
    """An already-float batch (e.g. a pipeline that made it float32 before) is not changed in place."""
    _, _, transform = defer_to_device([NormalizeImage(), Permute()], [])
    images = torch.full((1, 2, 2, 3), 255.0)
    out = transform(images)
    assert torch.equal(images, torch.full((1, 2, 2, 3), 255.0)) and out.shape == (1, 3, 2, 2)
    expected = (np.float32(1.0) - np.float32([0.485, 0.456, 0.406])) / np.float32([0.229, 0.224, 0.225])
    assert torch.equal(out[0, :, 0, 0], torch.from_numpy(expected.astype(np.float32)))


def test_the_transform_does_not_make_the_host_wait():
    """Its per-channel constants reach the device once per process, not with every batch (a copy
    of Python numbers to a GPU waits for the stream); after that a batch costs no host wait."""
    from ppdist.utils.host_sync import count_host_syncs

    _, _, transform = defer_to_device([NormalizeImage(mean=[0.1, 0.2, 0.3]), Permute()], [])
    transform = dataclasses.replace(transform, casts=(("label", "int64"),))
    images, label = torch.zeros((2, 4, 5, 3), dtype=torch.uint8), torch.zeros((2, 4, 5), dtype=torch.uint8)
    first = count_host_syncs(lambda: transform(images))
    assert first.count >= 1  # at least the new mean's copy (other constants may be known already)
    again = count_host_syncs(lambda: (transform(images), transform.cast("label", label)))
    assert again.count == 0, again.report()
