"""Which phases a deadline's step budget covers (``Phase.budgeted``): by default the one whose result is uploaded."""

from __future__ import annotations

from rayfed.train.phase import Kept, Phase, with_budget_cover


def test_by_default_the_budget_covers_the_last_phase_that_trains_the_rounds_model() -> None:
    # FedRep's head then body; Ditto's personal model then the global one; FedAvg's one phase
    head_body = with_budget_cover([Phase(epochs=10, trains=(8, 10)), Phase(epochs=1, trains=(0, 8))])
    personal_global = with_budget_cover([Phase(epochs=1, model=Kept("model"), reports=False), Phase(epochs=1)])
    assert [p.budgeted for p in head_body] == [False, True]
    assert [p.budgeted for p in personal_global] == [False, True]
    assert [p.budgeted for p in with_budget_cover([Phase(epochs=1)])] == [True]


def test_a_declared_cover_stands_and_a_method_without_the_rounds_model_has_none() -> None:
    declared = with_budget_cover([Phase(epochs=10, budgeted=True), Phase(epochs=1, budgeted=False)])
    assert [p.budgeted for p in declared] == [True, False]
    assert [p.budgeted for p in with_budget_cover([Phase(epochs=1, model=Kept("own"))])] == [False]
