"""ε after each round, from Google's ``dp-accounting`` (imported here only, and only when privacy is on).

Which analysis applies is decided by how rayfed samples, once (docs/privacy.md, "Which analysis"):

* every client every round (``engine.join_ratio >= 1``): the Gaussian mechanism on a sum whose sensitivity is C
  under adding or removing one client, composed over the rounds (RDP or PLD);
* ⌊join_ratio·N⌋ clients drawn without replacement each round (:func:`rayfed.util.seeding.sample_clients`): a fixed
  sample size, not Poisson sampling, so the analysis is sampling without replacement under replacing one client
  (Wang, Balle, Kasiviswanathan, AISTATS 2019, Theorem 27), where the clipped sum's sensitivity is 2C: the
  Gaussian's multiplier relative to it is z/2. dp-accounting has it for RDP only; PLD is refused there;
* Poisson sampling (``engine.participation="poisson"``: each client joins with probability q = join_ratio): the
  Poisson-subsampled Gaussian mechanism under adding or removing one client (sensitivity C, multiplier z),
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, for RDP and PLD alike;
* local DP: each client's own release is the Gaussian mechanism on an update of norm ≤ C (sensitivity 2C when its
  data are replaced: multiplier z/2), composed over every round without amplification (the server sees who
  reported);
* a sample that is not uniform over the N clients (a system model's availability: the rounds sample among the
  clients online): no amplification is claimed; each round is the Gaussian mechanism on the clipped sum under
  replacing one client (sensitivity 2C, multiplier z/2), an upper bound for every client, online or not;
* asynchronous aggregation (FedAsync, FedBuff): the same, composed over the server steps (``per="server step"``),
  each step's noise scaled to the most one client adds to it (docs/privacy.md, "Asynchronous aggregation").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rayfed.privacy.settings import PrivacyConfig
from rayfed.util.errors import ConfigError

__all__ = ["Accounting", "accounting_of"]


@dataclass(frozen=True)
class Accounting:
    """The analysis of one run: one round's dp-accounting event and the accountant that composes it."""

    accountant: str
    """``rdp`` or ``pld``."""
    noise_multiplier: float
    """The Gaussian's multiplier relative to the sensitivity of what it noises (z, or z/2: module docstring)."""
    num_clients: int
    per_round: int
    """Clients a round samples: N for every client (or no amplification), the fixed sample size m, or with Poisson
    sampling ⌊qN⌋ (the count the adaptive clipping's noise is set by; the event uses q)."""
    replace_one: bool
    """Whether neighbouring runs differ by one client replaced (sampling without replacement, local DP), not one
    added or removed."""
    delta: float
    poisson_rate: float | None = None
    """q of Poisson sampling, where each client joins a round independently with that probability; None: a fixed
    number, :attr:`per_round`, drawn without replacement."""
    per: str = "round"
    """What one composed event is, in words: a round, or an asynchronous run's server step."""

    @property
    def sampled(self) -> bool:
        """Whether the rounds sample a subset of the clients (amplification by sampling applies)."""
        if self.poisson_rate is not None:
            return self.poisson_rate < 1
        return self.per_round < self.num_clients

    @property
    def described(self) -> str:
        """The sampling the analysis counts, in words (``rayfed privacy`` prints it)."""
        if self.poisson_rate is not None:
            return f"each of {self.num_clients} clients with probability {self.poisson_rate:g} a {self.per} (Poisson)"
        if self.sampled:
            return f"{self.per_round} of {self.num_clients} clients a {self.per} (sampled without replacement)"
        return f"{self.num_clients} clients, every one counted every {self.per} (no amplification by sampling)"

    def event(self, noise_multiplier: float | None = None) -> Any:
        """One round's ``dp_event``: the (subsampled) Gaussian mechanism."""
        import dp_accounting

        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        gaussian = dp_accounting.GaussianDpEvent(z)
        if not self.sampled:
            return gaussian
        if self.poisson_rate is not None:
            return dp_accounting.PoissonSampledDpEvent(self.poisson_rate, gaussian)
        return dp_accounting.SampledWithoutReplacementDpEvent(self.num_clients, self.per_round, gaussian)

    def fresh(self) -> Any:
        """A new accountant of this analysis."""
        import dp_accounting

        relation = dp_accounting.NeighboringRelation
        neighbours = relation.REPLACE_ONE if self.replace_one else relation.ADD_OR_REMOVE_ONE
        if self.accountant == "pld":
            return dp_accounting.pld.PLDAccountant(neighbours)
        return dp_accounting.rdp.RdpAccountant(neighboring_relation=neighbours)

    def epsilon(self, rounds: int) -> float:
        """ε at :attr:`delta` after ``rounds`` rounds (0 before the first; inf without noise): a fresh
        accountant composing one round's event ``rounds`` times, as dp-accounting's own use gives it."""
        if rounds <= 0:
            return 0.0
        if self.noise_multiplier == 0:
            return math.inf
        accountant = self.fresh()
        accountant.compose(self.event(), rounds)
        return float(accountant.get_epsilon(self.delta))

    def noise_for(self, target_epsilon: float, rounds: int) -> float:
        """The smallest noise multiplier z (as ``privacy.noise_multiplier`` takes it) whose ε after ``rounds``
        rounds is at most ``target_epsilon`` (dp-accounting's calibration)."""
        import dp_accounting

        scale, low, high = self.noise_multiplier_scale, 0.3, 100.0
        if self.epsilon_at(high * scale, rounds) > target_epsilon:
            raise ConfigError(
                f"privacy.target_epsilon={target_epsilon:g} needs privacy.noise_multiplier above {high:g} over "
                f"{rounds} rounds: allow a larger epsilon or run fewer rounds"
            )
        if self.epsilon_at(low * scale, rounds) <= target_epsilon:
            return low  # any multiplier from here meets it; smaller ones are outside the search
        z = dp_accounting.calibrate_dp_mechanism(
            self.fresh,
            lambda zz: dp_accounting.SelfComposedDpEvent(self.event(zz * scale), rounds),
            target_epsilon,
            self.delta,
            dp_accounting.ExplicitBracketInterval(low, high),
            tol=1e-4,
        )
        return float(z)

    def epsilon_at(self, noise_multiplier: float, rounds: int) -> float:
        """ε after ``rounds`` rounds with the accountant's multiplier ``noise_multiplier`` instead of the run's."""
        accountant = self.fresh()
        accountant.compose(self.event(noise_multiplier), rounds)
        return float(accountant.get_epsilon(self.delta))

    @property
    def noise_multiplier_scale(self) -> float:
        """The accountant's multiplier per unit of ``privacy.noise_multiplier`` (1, or 1/2 under replace-one)."""
        return 0.5 if self.replace_one else 1.0


def accounting_of(
    privacy: PrivacyConfig,
    num_clients: int,
    per_round: int,
    poisson_rate: float | None = None,
    *,
    uniform: bool = True,
    per: str = "round",
) -> Accounting:
    """The analysis that applies to a run of ``num_clients`` clients sampling ``per_round`` each round, or each
    client with probability ``poisson_rate``; ``uniform``: whether that sample is drawn among all the clients
    (module docstring); ``per``: what one composed event is (``"server step"`` for asynchronous aggregation);
    ConfigError naming the fix where the chosen accountant has none, or dp-accounting is
    missing."""
    try:
        import dp_accounting  # noqa: F401  (checked before anything is written)
    except ImportError:
        raise ConfigError(
            f"privacy.mechanism={privacy.mechanism!r} needs Google's dp-accounting for its accountant: "
            "pip install 'rayfed[privacy]'"
        ) from None
    unamplified = privacy.mechanism == "local" or not uniform
    poisson = poisson_rate is not None and poisson_rate < 1 and not unamplified
    sampled = per_round < num_clients and not unamplified and not poisson
    replace_one = sampled or unamplified
    if sampled and privacy.accountant == "pld":
        raise ConfigError(
            f"privacy.accountant='pld' has no analysis of the fixed-size sampling engine.join_ratio does "
            f"({per_round} of {num_clients} clients drawn without replacement each round; dp-accounting's PLD "
            "accountant covers Poisson sampling only): set privacy.accountant='rdp', "
            "engine.participation='poisson', or engine.join_ratio=1"
        )
    z = privacy.noise_multiplier * (0.5 if replace_one else 1.0)
    return Accounting(
        privacy.accountant,
        z,
        num_clients,
        num_clients if unamplified else per_round,
        replace_one,
        privacy.delta,
        poisson_rate if poisson else None,
        per,
    )
