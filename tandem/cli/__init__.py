"""Client-side ``tandem`` subcommands: generate, chat, top and bench (they talk to a running
router or its workers; none of them starts a server)."""
