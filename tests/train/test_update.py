"""The optimisers' updates of the one loop (:mod:`rayfed.train.update`) are torch.optim's, operation for operation."""

from __future__ import annotations

import torch

from rayfed.train.flat import FlatModel
from rayfed.train.update import adam_scalars, adam_update, sgd_update


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 3))


def _twins() -> tuple[torch.nn.Module, torch.nn.Module, FlatModel]:
    torch.manual_seed(0)
    reference, ours = _net(), _net()
    ours.load_state_dict(reference.state_dict())
    return reference, ours, FlatModel(ours)


def _steps(
    reference: torch.nn.Module, ours: torch.nn.Module, flat: FlatModel, optimiser: torch.optim.Optimizer, update
) -> None:  # noqa: ANN001
    for step in range(4):
        x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(step))
        optimiser.zero_grad()
        reference(x).pow(2).mean().backward()
        optimiser.step()
        flat.zero_grad()
        ours(x).pow(2).mean().backward()
        update(step)


def test_sgd_update_is_torch_sgd_with_momentum_and_weight_decay() -> None:
    reference, ours, flat = _twins()
    buffer, lr = torch.zeros_like(flat.vector), torch.tensor(0.1)
    _steps(
        reference,
        ours,
        flat,
        torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01),
        lambda _: sgd_update([flat.vector], [flat.grad], lr, momentum=0.9, weight_decay=0.01, buffers=[buffer]),
    )
    for theirs, mine in zip(reference.parameters(), ours.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)


def test_adam_update_is_torch_adam() -> None:
    reference, ours, flat = _twins()
    m, v = torch.zeros_like(flat.vector), torch.zeros_like(flat.vector)
    scalars = torch.from_numpy(adam_scalars(0.01, (0.5, 0.999), 4))
    _steps(
        reference,
        ours,
        flat,
        torch.optim.Adam(reference.parameters(), lr=0.01, betas=(0.5, 0.999), foreach=False),
        lambda step: adam_update([flat.vector], [flat.grad], [m], [v], (0.5, 0.999), 1e-8, scalars[step]),
    )
    for theirs, mine in zip(reference.parameters(), ours.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)


def test_an_update_tensor_by_tensor_is_the_flat_update_bit_for_bit() -> None:
    """One client's parameters are updated tensor by tensor (each beside its fresh gradient), a stack's as one flat
    block: the pieces give the flat update's bits, for SGD with momentum and weight decay and for Adam."""
    torch.manual_seed(0)
    sizes = [832, 51_264, 4_099, 10, 3]  # vectorised bodies and scalar tails at every piece's end
    values, grads = torch.randn(sum(sizes)), torch.randn(sum(sizes))
    lr, scalars = torch.tensor(0.05), torch.tensor([0.03, -0.05])

    def pieces(t: torch.Tensor) -> list[torch.Tensor]:
        return list(t.split(sizes))

    flat = [values.clone(), torch.rand(sum(sizes)), torch.rand(sum(sizes))]
    cut = [t.clone() for t in flat]
    sgd_update([flat[0]], [grads], lr, momentum=0.9, weight_decay=0.01, buffers=[flat[1]])
    sgd_update(pieces(cut[0]), pieces(grads), lr, momentum=0.9, weight_decay=0.01, buffers=pieces(cut[1]))
    adam_update([flat[0]], [grads], [flat[1]], [flat[2]], (0.5, 0.999), 1e-8, scalars)
    adam_update(pieces(cut[0]), pieces(grads), pieces(cut[1]), pieces(cut[2]), (0.5, 0.999), 1e-8, scalars)
    for whole, split in zip(flat, cut):
        assert torch.equal(whole, split)
