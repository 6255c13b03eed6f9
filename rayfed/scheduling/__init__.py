"""The system model wired into the round loop: whom each round trains, when in virtual time, and what is recorded.

``sync_rounds`` says each round's clients and facts (``Rounds`` without a system model, ``VirtualRounds`` for
synchronous rounds in virtual time), ``async_rounds`` a round per server step of an asynchronous method;
``system_setup`` builds them from the config's ``system`` section before anything is written, ``workload`` finds
each client's work from its method's own phases and messages, ``calibration`` measures ``system.step_s`` on the
run's model, and ``system_records`` writes what a round's system model recorded (docs/system.md). The model itself
is :mod:`rayfed.system` (numpy alone).
"""
