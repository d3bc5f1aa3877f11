"""One module per `gpuvigil` subcommand; each exposes `register(app)`. Only `cli` imports these."""
