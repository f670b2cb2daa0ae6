"""zstalk native workers (see the native-workers issue); empty until then."""
