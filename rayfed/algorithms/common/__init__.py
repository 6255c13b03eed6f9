"""What several algorithms share, so that no algorithm imports another one for a helper.

* :mod:`~rayfed.algorithms.common.architecture`: the single-architecture check, "the last m blocks";
* :mod:`~rayfed.algorithms.common.global_model`: one global model θ_g: its broadcasts and server state;
* :mod:`~rayfed.algorithms.common.own_models`: clients that keep their own model between rounds;
* :mod:`~rayfed.algorithms.common.proximal`: FedProx's proximal term, also used by Ditto, FedAMP, FedDyn;
* :mod:`~rayfed.algorithms.common.body_head`: body/head splits (FedPer, FedRep, FedBABU, LG-FedAvg);
* :mod:`~rayfed.algorithms.common.cluster_state`: K cluster models (CFL, IFCA);
* :mod:`~rayfed.algorithms.common.class_counts`: per-class sample counts on the device (FedProto, FedNH).

The package imports nothing on its own: the torch-free modules (architecture, global_model)
keep a server half like FedAvg's free of torch.
"""
