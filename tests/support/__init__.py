"""Test helpers that are not tests (model generators). Imported as `tests.support.*`."""
