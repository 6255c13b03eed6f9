"""Where the algorithms' halves run: :class:`~rayfed.execution.client_runner.ClientRunner` (a worker:
trains and evaluates batches of clients), :class:`~rayfed.execution.server.Server` (the server:
aggregates and broadcasts) and the :class:`~rayfed.execution.executor.Executor` contract the round
loop is written against, with its in-process implementation. :mod:`rayfed.actors` wraps the same
plain classes in Ray actors."""
