"""Packing tensors for transfers between workers (yatt.control.transfer)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from yatt.control.transfer import PackedTensor, pack, unpack
from yatt.control.workers import payload_nbytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_round_trip_keeps_values_dtype_and_shape(dtype):
    tensor = (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) - 7).to(dtype)
    packed = pack(tensor)
    assert isinstance(packed, PackedTensor) and isinstance(packed.array, np.ndarray)
    back = unpack(pickle.loads(pickle.dumps(packed, protocol=5)))
    assert back.dtype == dtype and back.shape == tensor.shape
    assert torch.equal(back, tensor)


def test_nested_optimizer_like_state_round_trips_and_counts_bytes():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = {"weights": model.state_dict(), "optim": optimizer.state_dict(), "step": 3}
    packed = pack(state)
    assert payload_nbytes(packed["weights"]) == payload_nbytes(model.state_dict()) > 24
    back = unpack(pickle.loads(pickle.dumps(packed, protocol=5)))
    assert back["step"] == 3
    for name, tensor in model.state_dict().items():
        assert torch.equal(back["weights"][name], tensor)
    for key, moments in optimizer.state_dict()["state"].items():
        for name, value in moments.items():
            assert torch.equal(back["optim"]["state"][key][name], value)
    assert back["optim"]["param_groups"] == optimizer.state_dict()["param_groups"]


def test_copy_owns_its_memory_and_no_copy_aliases_it():
    source = torch.zeros(4)
    packed = pack(source)  # a view of `source` until a transfer copies it
    copied, aliased = unpack(packed), unpack(packed, copy=False)
    source += 1
    assert torch.equal(copied, torch.zeros(4))
    assert torch.equal(aliased, torch.ones(4))


def test_read_only_memory_unpacks_without_warning_and_copies_are_writable():
    array = np.arange(6, dtype=np.float32)
    array.setflags(write=False)  # as a zero-copy read from Ray's shared object store is
    packed = PackedTensor(array, torch.float32)
    with_warnings_as_errors = unpack(packed, copy=False)
    assert torch.equal(with_warnings_as_errors, torch.arange(6, dtype=torch.float32))
    copy = unpack(packed)
    copy.add_(1)  # the optimizer's moments are updated in place after an import
    assert float(copy.sum()) == 21.0


class _Holder:
    def __init__(self, value: float) -> None:
        self.value = torch.full((3,), value)

    def export(self) -> dict:
        return pack({"value": self.value})

    def take(self, state: dict) -> float:
        self.value = unpack(state)["value"]
        return float(self.value.sum())


def test_a_future_passed_as_an_argument_arrives_as_its_result():
    from yatt.control.devices import Device
    from yatt.control.workers import InProcessBackend

    backend = InProcessBackend()
    source = backend.spawn(_Holder, Device("cpu", 0), "source", 2.0)
    target = backend.spawn(_Holder, Device("cpu", 1), "target", 0.0)
    assert target.call("take", source.submit("export")) == 6.0


def test_tied_weights_are_packed_sent_and_counted_once():
    """A tied model's state dict names its embedding twice (embed_tokens, lm_head): packed,
    it is one array, which pickling (as a transfer does) carries once, and the receiver loads
    both names from it."""
    from yatt.models import tiny_model

    model, _ = tiny_model(seed=0)
    state = model.state_dict()
    embed, head = state["model.embed_tokens.weight"], state["lm_head.weight"]
    assert embed.data_ptr() == head.data_ptr()  # tied
    packed = pack(state)
    assert packed["model.embed_tokens.weight"] is packed["lm_head.weight"]
    whole = sum(t.numel() * t.element_size() for t in state.values())
    assert payload_nbytes(packed) < whole - embed.numel() * embed.element_size() + 10_000
    untied = {key: value.clone() for key, value in state.items()}
    assert len(pickle.dumps(packed, protocol=5)) < 0.7 * len(pickle.dumps(pack(untied), protocol=5))
    copy, _ = tiny_model(seed=1)
    copy.load_state_dict(unpack(pickle.loads(pickle.dumps(packed, protocol=5))))
    assert (
        torch.equal(copy.lm_head.weight, head)
        and copy.lm_head.weight is copy.model.embed_tokens.weight
    )
