"""The wiring above the actors: the `zstalk` and `zstalkd` commands, the one-process
server, the supervisor of front processes, and the settings each actor is built from.
No actor imports this package."""
