"""What is task-specific outside the model, one module per task behind one registry
(``ppdist.tasks.registry``): rec, det, seg, table. ``task_of(config)`` is where a config's task is
resolved; adding a task is one module here (registered below) plus its components."""

from ppdist.tasks import det, rec, seg, table  # noqa: F401  (each registers its Task)
from ppdist.tasks.registry import TASKS, BenchmarkData, BrowsePanel, GraphSpec, Task, get_task, task_of

__all__ = ["TASKS", "BenchmarkData", "BrowsePanel", "GraphSpec", "Task", "get_task", "task_of"]
