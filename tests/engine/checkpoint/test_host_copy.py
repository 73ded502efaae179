"""HostCopier: a checkpoint state the background writer owns, whatever the training does next."""

from collections import OrderedDict

import torch
from torch import nn

from ppdist.engine.checkpoint.host_copy import HostCopier


def test_the_copy_keeps_the_values_of_the_moment_it_was_taken():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = optimizer.state[model.weight]["momentum_buffer"].clone()

    host, events = HostCopier().copy(state)
    optimizer.step()  # in place: the weights and the momentum change under the state dicts
    with torch.no_grad():
        model.bias.fill_(7.0)

    assert events == []  # nothing on a device
    for key, value in before.items():
        assert torch.equal(host["model"][key], value), key
    assert torch.equal(host["optimizer"]["state"][0]["momentum_buffer"], momentum)
    assert not torch.equal(host["model"]["bias"], model.bias.detach())
    assert host["step"] == 1 and host["optimizer"]["param_groups"][0]["lr"] == 0.1


def test_a_tensor_named_twice_stays_one_tensor_and_the_state_dict_metadata_stays():
    shared = torch.arange(4.0)
    state = OrderedDict(a=shared, b=shared)
    state._metadata = OrderedDict({"": {"version": 2}})  # what nn.Module.state_dict() attaches
    host, _ = HostCopier().copy({"model": state, "pair": (shared, [shared])})
    assert type(host["model"]) is OrderedDict and host["model"]._metadata == {"": {"version": 2}}
    assert host["model"]["a"] is host["model"]["b"] is host["pair"][0] is host["pair"][1][0]
    assert host["model"]["a"] is not shared and torch.equal(host["model"]["a"], shared)
    assert type(host["pair"]) is tuple and type(host["pair"][1]) is list


def test_the_buffers_are_reused_by_the_next_copy_and_given_back_by_clear():
    copier = HostCopier()
    weight = torch.zeros(5)
    first, _ = copier.copy({"w": weight})
    weight += 2
    second, _ = copier.copy({"w": weight})
    assert second["w"].data_ptr() == first["w"].data_ptr()  # no new allocation (page faults) per save
    assert torch.equal(second["w"], torch.full((5,), 2.0))
    third, _ = copier.copy({"w": torch.zeros(6)})  # another shape: a new buffer
    assert third["w"].shape == (6,)
    copier.clear()
    assert copier.copy({"w": weight})[0]["w"].data_ptr() != third["w"].data_ptr()
