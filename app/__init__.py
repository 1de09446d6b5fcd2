"""The web layer: routes, schemas, settings, service (plan -> run -> payload), wire codec, client, CLI."""
