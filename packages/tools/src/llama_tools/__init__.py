"""Engine-free server features shared by ``llama-server`` and ``llama-router``.

Nothing here imports numba or the engine, so the router can serve these routes without either.
"""

__all__: list[str] = []
