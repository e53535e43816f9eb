"""Setup: getting a model onto the machine (the default model's download)."""
