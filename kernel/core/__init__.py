"""The pure core: the flow model and compiler, expressions, events, the snapshot, the reducer, the scheduling rules, commands' judgement, budgets and causes; no I/O, clock, randomness, threads or anyio, and imports of core/ and errors only.

What a run does is decided here (``reducer.apply``, ``scheduling.decide``); the run shell (``run/``)
executes node runs and persists what these functions return. Ids and timestamps arrive in events.
"""
