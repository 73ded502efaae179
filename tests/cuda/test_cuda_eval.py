"""Evaluation's batch NMS and OHEM's k-th probability give on the GPU exactly what they give on
the CPU (where tests/postprocess and tests/losses check them against torchvision and kthvalue)."""

import torch

from ppdist.losses.seg import kth_smallest
from ppdist.postprocess.nms import MultiClassNMS


def _tied_detections(batch, classes, anchors, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.floor(torch.rand(batch, classes, anchors, generator=gen) * 24) / 24  # ties
    xy = torch.rand(batch, anchors, 2, generator=gen) * 300
    boxes = torch.cat([xy, xy + torch.rand(batch, anchors, 2, generator=gen) * 80 + 4], dim=-1)
    scale = torch.rand(batch, 2, generator=gen) + 0.5
    return scores, boxes, {"im_id": torch.arange(batch).reshape(batch, 1), "scale_factor": scale}


def test_the_batch_nms_on_cuda_equals_the_cpu():
    scores, boxes, batch = _tied_detections(4, 24, 2000, seed=1)  # past torchvision's CUDA loop threshold
    post = MultiClassNMS(score_threshold=0.5, nms_top_k=1000, keep_top_k=300, nms_threshold=0.6)
    on_cpu = post({"scores": scores, "boxes": boxes}, batch)
    on_gpu = post({"scores": scores.cuda(), "boxes": boxes.cuda()}, batch)  # ids and scales on the host
    assert len(on_cpu) == len(on_gpu) == 4
    for want, got in zip(on_cpu, on_gpu):
        assert want["im_id"] == got["im_id"] and len(want["scores"]) == 300
        for key in ("labels", "scores", "boxes"):
            assert not got[key].is_cuda and torch.equal(want[key], got[key]), key


def test_the_kth_smallest_probability_on_cuda_equals_kthvalue():
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(0, 1000, (2_000_000,), generator=gen).float() / 1000  # ~2M pixels, ties
    for k in (1, 130_000, 1_999_999):
        assert torch.equal(kth_smallest(values.cuda(), k).cpu(), torch.kthvalue(values, k).values)
