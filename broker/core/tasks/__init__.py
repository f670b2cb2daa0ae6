"""Cloud tasks (functions called over HTTP) and the cron schedules that enqueue them."""
