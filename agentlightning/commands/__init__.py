"""The `agl` umbrella's own subcommands: those that combine components (`agl train`, `agl init`)."""
