"""zstalk broker: the actor that owns every tube, job and session."""
