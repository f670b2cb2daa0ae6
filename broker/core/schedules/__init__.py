"""Cron schedules: cron.py reads and steps a 6-field cron expression in a time zone,
schedules.py holds the schedules and fires them as ordinary tasks into the task store
(core/tasks/), commands.py answers the HTTP front's schedule ops."""
