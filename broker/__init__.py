"""zstalk broker: the actor that owns every tube, job and session."""

VERSION = "0.1.0"
