"""Processing: tasks that own stores, and the manager that runs them.

* :mod:`~statestore.processing.task` -- active and standby tasks and their
  lifecycle states.
* :mod:`~statestore.processing.updater` -- restoration of active tasks and
  updates of standbys, a bounded amount of work per call.
* :mod:`~statestore.processing.task_manager` -- assignment, commit and close
  of the tasks of one instance.
* :mod:`~statestore.processing.record_collector` -- the records a task sends
  to its changelogs, staged until commit.
"""
