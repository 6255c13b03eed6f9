"""How clients train: their model as a flat vector (:mod:`~rayfed.train.flat`), what every process
knows about the run's models (:mod:`~rayfed.train.problem`), one client's job (:mod:`~rayfed.train.job`),
the phases a method declares (:mod:`~rayfed.train.phase`) and the one loop that trains them
(:mod:`~rayfed.train.loop`): one client at a time (:mod:`~rayfed.train.sequential`) or stacked
(:mod:`~rayfed.train.stacked`), both through one step rule (:mod:`~rayfed.train.rule`) and one set of
updates (:mod:`~rayfed.train.update`), replayed from CUDA graphs (:mod:`~rayfed.train.graphs`); and
evaluation (:mod:`~rayfed.train.evaluate`).

The package imports nothing on its own, so a process that needs only the torch-free modules
(:mod:`~rayfed.train.layout`, :mod:`~rayfed.train.problem`: a server half's) does not import torch.
"""
