"""Test helpers that are not tests and that only the tests use (fixtures, the scripted fake
engine, fault servers); what the benchmarks share with the tests, the model generators among
them, is in `devkit/`. Imported as `tests.support.*`."""
