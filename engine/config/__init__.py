"""Configuration: where files live, the profile schema, profile files and `settings.toml`."""
