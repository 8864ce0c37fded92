"""The runner core: every rule of a runner, written once and free of I/O.

This package is internal; its public names are re-exported from
:mod:`sqlalchemy_watchdog`. It imports no database: neither SQLAlchemy nor
the store. What it needs from outside it names in :mod:`.ports` (the
:class:`~.ports.Store` a :class:`~.state.RunnerCore` holds, which the
drivers fill with :mod:`sqlalchemy_watchdog.store`); the records it
exchanges with the store live in :mod:`sqlalchemy_watchdog.records`, below
both. ``lint-imports`` checks it (the contracts in ``pyproject.toml``).

A runner is a loop of small decisions: how many jobs to claim for the free
slots, whether a claimed job may still start, how a handler's answer becomes
a settlement, what a refused settlement means, which disappeared claims to
recover and with what budget, when to look again, how long to back off after
a failed pass, and how to shut down. Each decision is a generator of
**steps** -- typed requests for I/O (:mod:`.steps`: a store call made with
``yield from call(core.store.fn, ...)``, running a handler, stopping one, a
liveness probe, spawning executions, waiting for them) -- driven by one of
two drivers that only perform them:

* :class:`~sqlalchemy_watchdog.Runner` runs store calls on a ``Connection``
  and handlers in threads;
* :class:`~sqlalchemy_watchdog.asyncio.AsyncRunner` runs store calls through
  ``AsyncConnection.run_sync`` and handlers as tasks.

Neither driver contains a rule the other lacks. A store failure reaches the
generator that asked for it as a :class:`~sqlalchemy_watchdog.WatchdogError`
thrown at its ``yield``; a generator is only ever driven by one thread, from
its first step to its return.

The modules:

* :mod:`.handlers` -- the handler registry (``@handler``), the policy each
  handler carries, :class:`~.handlers.RunningJob` and stop signals;
* :mod:`.settings` -- the runner options, declared once
  (:class:`~sqlalchemy_watchdog.RunnerOptions`), and the validated
  :class:`~.settings.RunnerSettings`;
* :mod:`.clock` -- the one :class:`~.clock.Clock` a core reads the time from;
* :mod:`.ports` -- what the core needs from outside: the
  :class:`~.ports.Store` protocol (every store operation it calls) and the
  wake-ups' :class:`~.ports.Waiting`;
* :mod:`.steps` -- the steps, ``call`` and the two ``drive`` functions;
* :mod:`.execution` -- :class:`~.execution.Execution`, one claim being executed;
* :mod:`.state` -- :class:`~.state.RunnerCore` (one runner's state and
  timing);
* :mod:`.loop` -- claim, execute, heartbeat, a loop pass, ``tick``, shutdown;
* :mod:`.rules.settle` -- what a handler's answer means: one
  :func:`~.rules.settle.verdict`, the settle it makes, what the settlement
  means (:func:`~.rules.settle.conclude`);
* :mod:`.maintenance` -- recovery, promotion, schedules, retention, the
  worker's row and the summary.

An execution's steps end where its settlement starts (``execute`` returns a
``SettleRequest``): the driver settles it -- in a batch with others, on
whatever thread or task does that -- and the job's end is then the pure
function ``conclude`` of the execution and its settlement.
"""
