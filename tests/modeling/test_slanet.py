"""SLANet's stages (PPLCNet, CSPPAN, SLAHead) on a tiny model: shapes and channels, the decode's
feedback of its own tokens, no host read in a training step, config errors, fc_decay tags.
Equality with PaddleOCR's model: tests/convert/test_table_model.py."""

import copy

import pytest
import torch

from ppdist.benchmark.op_count import OpCount, _Counting
from ppdist.components import build_model
from ppdist.errors import ConfigError
from ppdist.modeling.architectures import BaseModel
from ppdist.modeling.heads.slanet import one_hot
from ppdist.utils.host_sync import count_host_syncs

CLASSES = 9
STEPS = 5  # max_text_length 4 (+1)


def tiny_arch(**head):
    return {
        "model_type": "table",
        "algorithm": "SLANet",
        "Backbone": {"name": "PPLCNet", "scale": 0.25},
        "Neck": {"name": "CSPPAN", "out_channels": 16},
        "Head": dict(
            {"name": "SLAHead", "hidden_size": 16, "max_text_length": 4, "out_channels": CLASSES}, **head
        ),
    }


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return BaseModel(tiny_arch())


def batch(images=2, size=(32, 48)):
    generator = torch.Generator().manual_seed(1)
    return {
        "image": torch.randn(images, 3, *size, generator=generator),
        "structure": torch.randint(0, CLASSES, (images, STEPS + 1), generator=generator),
    }


def test_levels_and_channels_chain_from_backbone_to_head(model):
    assert model.backbone.out_channels == [16, 32, 64, 128]  # int(c * 0.25) for 64, 128, 256, 512
    assert model.neck.out_channels == [16] * 4
    assert model.head.structure_attention_cell.i2h.in_features == 16  # the last level's channels
    x = batch()["image"]
    with torch.no_grad():
        feats = model.backbone(x)
        neck = model.neck(feats)
    assert [tuple(f.shape[1:]) for f in feats] == [(16, 8, 12), (32, 4, 6), (64, 2, 3), (128, 1, 2)]
    assert [tuple(f.shape[1:]) for f in neck] == [(16, 8, 12), (16, 4, 6), (16, 2, 3), (16, 1, 2)]


def test_training_outputs_are_scores_and_boxes_for_each_teacher_step(model):
    model.train()
    data = batch()
    out = model(data)
    assert set(out) == {"structure_probs", "loc_preds"}
    assert tuple(out["structure_probs"].shape) == (2, STEPS, CLASSES)
    assert tuple(out["loc_preds"].shape) == (2, STEPS, 4)
    sums = out["structure_probs"].detach().sum(-1)
    assert float((sums - 1).abs().max()) > 0.1  # scores (logits, as the original), not probabilities
    assert (
        0 < float(out["loc_preds"].detach().min()) and float(out["loc_preds"].detach().max()) < 1
    )  # sigmoid
    # step i reads token i only: changing the last token (never read: max_text_length + 1 steps) changes nothing
    changed = dict(data, structure=data["structure"].clone())
    changed["structure"][:, STEPS] = (changed["structure"][:, STEPS] + 1) % CLASSES
    with torch.no_grad():
        torch.testing.assert_close(
            model.head(model.neck(model.backbone(data["image"])), batch=changed)["loc_preds"],
            model.head(model.neck(model.backbone(data["image"])), batch=data)["loc_preds"],
        )
    model.eval()


def test_eval_decode_reads_its_own_previous_token_starting_from_sos(model):
    """The decode equals teacher forcing on [0 (sos), its own arg-max tokens]: the head has no
    BatchNorm, so its training mode on the same maps is the teacher-forced pass."""
    model.eval()
    with torch.no_grad():
        neck = model.neck(model.backbone(batch()["image"]))
        decoded = model.head(neck)
        tokens = decoded["structure_probs"].argmax(-1)
        fed = torch.cat((torch.zeros(2, 1, dtype=torch.long), tokens), dim=1)
        model.head.train()
        forced = model.head(neck, batch={"structure": fed})
        model.head.eval()
    torch.testing.assert_close(decoded["structure_probs"].sum(-1), torch.ones(2, STEPS))
    torch.testing.assert_close(forced["structure_probs"].softmax(-1), decoded["structure_probs"])
    torch.testing.assert_close(forced["loc_preds"], decoded["loc_preds"])


def test_head_training_step_reads_nothing_on_the_host(model):
    """The head's teacher-forced forward and backward read no device value (the one-hot is a
    comparison, not F.one_hot's range check); the backbone and neck are plain conv stacks."""
    head = copy.deepcopy(model.head).train()
    feats = [torch.randn(2, 16, 1, 2, requires_grad=True)]
    structure = batch()["structure"]

    def step():
        out = head(feats, batch={"structure": structure})
        (out["structure_probs"].mean() + out["loc_preds"].mean()).backward()

    counter = count_host_syncs(step)
    assert counter.count == 0, counter.report()
    assert feats[0].grad is not None and float(feats[0].grad.abs().sum()) > 0


def test_training_without_structure_fails_with_the_key():
    head = copy.deepcopy(BaseModel(tiny_arch()).head).train()
    feats = [torch.randn(1, 16, 2, 2)]
    with pytest.raises(KeyError, match="needs the batch entry 'structure'"):
        head(feats)
    with pytest.raises(ValueError, match=r"max_text_length \+ 1 = 5\) token indices, got shape \(1, 3\)"):
        head(feats, batch={"structure": torch.zeros(1, 3, dtype=torch.long)})


@pytest.mark.parametrize(
    "stage, key, value, message",
    [
        (
            "Neck",
            "act",
            "relu",
            r"Architecture.Neck \(CSPPAN\): CSPPAN.act must be one of \['leaky_relu', 'hard_swish'\]",
        ),
        ("Neck", "kernel_size", 4, r"CSPPAN.kernel_size must be odd"),
        (
            "Backbone",
            "scale",
            0,
            r"Architecture.Backbone \(PPLCNet\): PPLCNet.scale must be a positive number",
        ),
        (
            "Head",
            "hidden_size",
            0,
            r"Architecture.Head \(SLAHead\): SLAHead.hidden_size must be a positive integer",
        ),
        ("Head", "loc_reg_num", 2.5, r"Architecture.Head.loc_reg_num: expected int, got float \(2.5\)"),
    ],
)
def test_bad_values_fail_naming_the_key(stage, key, value, message):
    arch = tiny_arch()
    arch[stage][key] = value
    with pytest.raises(ConfigError, match=message):
        build_model({"Global": {}, "Architecture": arch})


def test_use_ssld_is_accepted_and_other_keys_are_refused():
    arch = tiny_arch()
    arch["Backbone"].update(use_ssld=True)
    assert build_model({"Global": {}, "Architecture": arch}).backbone.scale == 0.25
    arch["Backbone"]["ssld"] = True
    with pytest.raises(ConfigError, match="ssld"):
        build_model({"Global": {}, "Architecture": arch})


def test_fc_decay_tags_the_generators_only_and_survives_a_copy():
    head = BaseModel(tiny_arch(fc_decay=1e-5)).head
    for module in (head, copy.deepcopy(head)):
        tagged = {
            name for name, p in module.named_parameters() if getattr(p, "regularizer_factor", None) == 1e-5
        }
        assert tagged == {
            f"{part}.{i}.{leaf}"
            for part in ("structure_generator", "loc_generator")
            for i in (0, 1)
            for leaf in ("weight", "bias")
        }
    plain = BaseModel(tiny_arch()).head
    assert not any(hasattr(p, "regularizer_factor") for p in plain.parameters())


def test_backbone_batch_norms_have_no_weight_decay_as_the_original(model):
    """det_pp_lcnet's BatchNorms carry L2Decay(0.0); CSPPAN's and the head's follow the optimizer."""
    factors = {
        name: getattr(p, "regularizer_factor", None) for name, p in copy.deepcopy(model).named_parameters()
    }
    assert factors["backbone.conv1.bn.weight"] == 0.0 and factors["backbone.blocks6.1.pw_conv.bn.bias"] == 0.0
    assert (
        factors["backbone.conv1.conv.weight"] is None and factors["backbone.blocks6.0.se.conv1.bias"] is None
    )
    assert factors["neck.conv_t.convs.0.bn.weight"] is None
    assert not any(name.startswith("head.") and value is not None for name, value in factors.items())


def test_exported_gru_cell_computes_what_grucell_computes():
    """The scripted (exported) decode runs the GRU cell as ``gru_cell``'s elementary operations."""
    from ppdist.modeling.heads.slanet import gru_cell

    torch.manual_seed(2)
    rnn = torch.nn.GRUCell(7, 5)
    inputs, hidden = torch.randn(3, 7), torch.randn(3, 5)
    with torch.no_grad():
        torch.testing.assert_close(gru_cell(inputs, hidden, rnn), rnn(inputs, hidden), rtol=0, atol=1e-6)


def cell_by_cell(head, fea, structure):
    """The teacher-forced steps as ``AttentionGRUCell`` computes them, one cell call a step (the
    loop before issue 41): the reference for the rearranged loop."""
    steps = head.max_text_length + 1
    tokens = one_hot(structure[:, :steps], head.classes, fea.dtype)
    cell = head.structure_attention_cell
    hidden, fea_proj, outputs = fea.new_zeros((fea.shape[0], head.hidden_size)), cell.i2h(fea), []
    for i in range(steps):
        hidden, _ = cell(hidden, fea, fea_proj, tokens[:, i])
        outputs.append(hidden)
    output = torch.stack(outputs, dim=1)
    return {"structure_probs": head.structure_generator(output), "loc_preds": head.loc_generator(output)}


@pytest.mark.parametrize("autocast", [False, True])
def test_teacher_forced_loop_equals_the_cell_step_by_step_with_its_gradients(autocast):
    """Fewer kernels (issue 41): one GEMM for both reads of the hidden state, the token gates of
    every step before the loop, the shared weights' gradients after it; the same outputs and
    gradients (of every head parameter and of the features) as the cell called step by step in
    float32 (under bf16 autocast within 3% of each tensor's largest value, as close as the cell
    itself is under autocast)."""
    torch.manual_seed(3)
    head = BaseModel(tiny_arch(max_text_length=11)).head.train()
    fea = torch.randn(3, 16, 2, 3)
    structure = torch.randint(0, CLASSES, (3, 13), generator=torch.Generator().manual_seed(4))
    weights = {"structure_probs": torch.randn(3, 12, CLASSES), "loc_preds": torch.randn(3, 12, 4)}
    results = []
    for run in ("ours", "reference"):
        head.zero_grad()
        x = fea.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast and run == "ours"):
            if run == "ours":
                out = head(x, batch={"structure": structure})
            else:
                out = cell_by_cell(head, head.flat_features(x), structure)
        sum((out[k].float() * w).sum() for k, w in weights.items()).backward()
        grads = {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}
        results.append(({k: v.detach().float() for k, v in out.items()}, dict(grads, fea=x.grad.clone())))
    (out, grads), (want_out, want_grads) = results
    assert set(grads) == set(want_grads) == {n for n, _ in head.named_parameters()} | {"fea"}
    for name, want in [*want_out.items(), *want_grads.items()]:
        got = out[name] if name in out else grads[name]
        assert got.dtype == want.dtype
        if autocast:
            scale = float(want.abs().max())
            torch.testing.assert_close(got, want, rtol=0, atol=0.03 * scale, msg=name)
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


def teacher_step_ops(length):
    torch.manual_seed(3)
    head = BaseModel(tiny_arch(max_text_length=length)).head.train()
    x = torch.randn(3, 16, 2, 3, requires_grad=True)
    structure = torch.randint(0, CLASSES, (3, length + 2), generator=torch.Generator().manual_seed(4))
    forward, backward = OpCount(), OpCount()
    with _Counting(forward):
        out = head(x, batch={"structure": structure})
    loss = out["structure_probs"].sum() + out["loc_preds"].sum()
    with _Counting(backward):
        loss.backward()
    return forward.total, backward.total


def test_a_teacher_forced_step_costs_14_operators_forward_and_21_backward():
    """Per decode step (12 more steps, counted on the CPU): 21 forward and 39 backward with the
    cell called step by step (issue 41's start), 14 and 21 now (one GEMM for both reads of the
    hidden state, the token gates before the loop, the shared weights' and the features'
    gradients after it, the GRU gates' written-out backward)."""
    (forward_short, backward_short), (forward_long, backward_long) = (
        teacher_step_ops(11),
        teacher_step_ops(23),
    )
    assert (forward_long - forward_short, backward_long - backward_short) == (12 * 14, 12 * 21)
