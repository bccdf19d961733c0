"""The user's commands (docs/architecture.md#layers): ``cli`` (the ``largeprompt`` entry point: ``inspect``, ``claims``,
``compare``, ``calibrate``, ``check-config``, ``publish``, ``bench``), ``reading`` (a run's tables and provenance read
for a person), ``publish`` (a run's figures, tables, claims and times into a folder such as docs/paper-run) and
``report`` (the HTML report's page). The application layer: it may import every layer below it.
"""
