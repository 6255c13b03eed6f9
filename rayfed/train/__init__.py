"""How one client trains: its model as a flat vector (:mod:`~rayfed.train.flat`), what every process
knows about the run's models (:mod:`~rayfed.train.problem`), one client's job (:mod:`~rayfed.train.job`),
local SGD one client at a time (:mod:`~rayfed.train.sgd`) or stacked (:mod:`~rayfed.train.stacked`), and
evaluation (:mod:`~rayfed.train.evaluate`).

The package imports nothing on its own, so a process that needs only the torch-free modules
(:mod:`~rayfed.train.layout`, :mod:`~rayfed.train.problem`: a server half's) does not import torch.
"""
