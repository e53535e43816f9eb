"""The profile form of the settings screen."""
