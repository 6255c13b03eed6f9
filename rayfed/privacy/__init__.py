"""Differential privacy of the clients' uploads (docs/privacy.md): the ``privacy`` config section, clipping,
the seeded Gaussian noise and the accountant.

DP-FedAvg (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018): each client's
update Δ_i = θ_i − θ_g is clipped to ``privacy.clip_norm`` in L2, the server adds Gaussian noise of standard
deviation ``noise_multiplier · clip_norm`` to their sum once (``mechanism="central"``) or each client to its own
(``"local"``), and the sum is averaged over the clients the round planned. ``accountant`` turns the run's sampling,
noise and rounds into ε at ``delta`` with Google's ``dp-accounting`` (imported only when privacy is on).

Plain numpy (torch only inside the clipping of tensors): nothing here knows of models, methods or Ray.
"""

from rayfed.privacy.settings import ACCOUNTANTS, MECHANISMS, WEIGHTINGS, PrivacyConfig

__all__ = ["PrivacyConfig", "MECHANISMS", "ACCOUNTANTS", "WEIGHTINGS"]
