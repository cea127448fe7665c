"""Every reproduction registers in ``fedveil.reproduce.REPRODUCTIONS`` when its package is
imported (what ``fedveil reproduce`` does through the entry point)."""
import fedveil_reproductions  # noqa: F401
