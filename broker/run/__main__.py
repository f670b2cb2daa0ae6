"""`python -m zstalk.broker.run ...`: the `zstalk` command (what the supervisor runs its
children with)."""
from .cli import main

main()
