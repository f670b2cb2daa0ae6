"""zstalk protocols: sans-IO parsers, the actor message schema and the protocol fronts."""
