"""Beanstalk tubes, jobs and commands, and the native worker pools that share the queue."""
