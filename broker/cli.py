"""`python -m zstalk.broker.cli` (before 0.2): kept one release for scripts that start it;
the command lives in zstalk.broker.run (`python -m zstalk.broker.run`)."""
from .run.cli import main

if __name__ == "__main__":
    main()
