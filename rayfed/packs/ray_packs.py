"""Packs of ``engine.backend="ray"`` runs: each pack one Ray task, its host (:mod:`rayfed.actors.pack_host`), and
the packs that join one cluster at once, each where Ray places it (docs/architecture.md, "Runs that share one
stack")."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import cloudpickle

from rayfed.config import EngineConfig, RunConfig
from rayfed.engine.callbacks import Callback
from rayfed.packs.pack_threads import PackOutcome, hosted_pack
from rayfed.util import plugins
from rayfed.util.errors import RayfedError

logger = logging.getLogger(__name__)

__all__ = ["run_packs_on_ray"]

Pack = tuple[int, ...]


def _session(engine: EngineConfig) -> tuple[object, ...]:
    """What :func:`~rayfed.actors.cluster.ray_session` reads of ``engine``: packs that agree in it share one Ray."""
    return engine.ray_address, engine.dashboard, engine.dashboard_host


def run_packs_on_ray(
    packs: Sequence[Pack], configs: Sequence[RunConfig], callbacks: Sequence[Sequence[Callback]], resume: bool
) -> tuple[dict[Pack, PackOutcome | BaseException], list[int]]:
    """Run ``packs`` (positions of ``configs``) as Ray tasks, those that share a Ray at once. Returns each pack's
    outcome (or the error that kept it from starting: code that cannot be sent, a cluster without room for its
    host, a host that died), and the positions of runs whose callbacks cannot be sent to a host, which then run
    alone as :func:`rayfed.run` runs them."""
    outcomes: dict[Pack, PackOutcome | BaseException] = {}
    alone: list[int] = []
    sessions: dict[tuple[object, ...], list[Pack]] = {}
    for whole in packs:
        pack = _sendable(whole, callbacks, alone)
        if not pack:
            continue
        try:
            for index in pack:  # said before Ray starts, as rayfed.run says it
                plugins.check_shippable(configs[index])
        except RayfedError as error:
            outcomes[pack] = error
            continue
        sessions.setdefault(_session(configs[pack[0]].engine), []).append(pack)
    for group in sessions.values():
        _run_group(group, configs, callbacks, resume, outcomes, alone)
    return outcomes, alone


def _sendable(pack: Pack, callbacks: Sequence[Sequence[Callback]], alone: list[int]) -> Pack:
    """The runs of ``pack`` whose callbacks pickle, which its host receives (none where fewer than two do); the
    others are put in ``alone``, as the log says."""
    sendable: list[int] = []
    for index in pack:
        try:
            cloudpickle.dumps(list(callbacks[index]))
            sendable.append(index)
        except Exception as error:  # noqa: BLE001 - pickling fails in many ways; each is named
            logger.info(
                "rayfed.run_many: run %d trains alone: its callbacks cannot be sent to its pack's host (%s: %s)",
                index,
                type(error).__name__,
                error,
            )
            alone.append(index)
    if len(sendable) < 2:
        alone.extend(sendable)
        return ()
    return tuple(sendable)


def _run_group(
    group: list[Pack],
    configs: Sequence[RunConfig],
    callbacks: Sequence[Sequence[Callback]],
    resume: bool,
    outcomes: dict[Pack, PackOutcome | BaseException],
    alone: list[int],
) -> None:
    """Start every pack of ``group`` on the one Ray they share, then wait for them all."""
    from rayfed.actors import check_resources, ray_session
    from rayfed.actors.pack_host import gather, host, one_worker

    engine = configs[group[0][0]].engine
    sources = [source for pack in group for index in pack for source in plugins.run_sources(configs[index])]
    with ray_session(engine, sources):
        started: list[Pack] = []
        refs = []
        for pack in group:
            pack_engine = configs[pack[0]].engine
            try:
                check_resources(one_worker(pack_engine))
            except RayfedError as error:
                outcomes[pack] = error
                continue
            shipped = [(plugins.WithCode(configs[index]), list(callbacks[index])) for index in pack]
            refs.append(host(pack_engine, hosted_pack, shipped, resume, os.getcwd()))
            started.append(pack)
        for pack, outcome in zip(started, gather(refs)):
            outcomes[pack] = outcome
