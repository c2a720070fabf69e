"""The arena: algorithm comparisons on the toy world with confidence intervals (``sage-arena``; docs/arena.md).

A grid of algorithms x tasks x seeds (`grid`), each cell a ``sage-train`` run in a worker process with one torch
thread (`cell`, `runner`), its transformer FLOPs counted (`compute`), compared by interquartile means with
stratified bootstrap intervals, the probability of improvement, performance profiles and compute to a target
(`stats`), in a Markdown report with figures (`report`).
"""

from sage_trl.arena.grid import PROFILES, VARIANTS, ArenaGrid, Cell
from sage_trl.arena.tasks import TASKS, ArenaTask

__all__ = ["PROFILES", "TASKS", "VARIANTS", "ArenaGrid", "ArenaTask", "Cell"]
