"""Cloud tasks: functions called over HTTP (the cron schedules that enqueue them are in
core/schedules/)."""
