"""zstalk protocols: the actor message schema (schema.py), sans-IO codecs, the protocol
fronts, and the transport between actors."""
